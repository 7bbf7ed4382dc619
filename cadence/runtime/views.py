"""Typed views over raw byte ranges (shared by the CUDA and CPU buffers)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def byte_range(
    nbytes: int, itemsize: int, shape: tuple[int, ...] | None, offset: int
) -> tuple[tuple[int, ...], int]:
    """Resolve (shape, byte length) of a view and check it fits in ``nbytes``."""
    if offset < 0 or offset % itemsize:
        raise ValueError(f"offset {offset} must be a non-negative multiple of {itemsize}")
    if shape is None:
        shape = ((nbytes - offset) // itemsize,)
    length = _numel(shape) * itemsize
    if offset + length > nbytes:
        raise ValueError(
            f"a view of shape {shape} ({length} bytes) at offset {offset} exceeds {nbytes} bytes"
        )
    return shape, length


def torch_view(
    flat: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...] | None, offset: int
) -> torch.Tensor:
    """View a flat uint8 tensor as ``dtype`` with ``shape`` starting at byte ``offset``."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    shape, length = byte_range(flat.numel(), itemsize, shape, offset)
    return flat[offset : offset + length].view(dtype).view(shape)


def numpy_view(
    flat: np.ndarray, dtype: Any, shape: tuple[int, ...] | None, offset: int
) -> np.ndarray:
    """View a flat uint8 array as ``dtype`` with ``shape`` starting at byte ``offset``."""
    dt = np.dtype(dtype)
    shape, length = byte_range(flat.size, dt.itemsize, shape, offset)
    return flat[offset : offset + length].view(dt).reshape(shape)
