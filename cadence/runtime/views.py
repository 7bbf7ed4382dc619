"""Typed views over raw byte ranges, shared by the CUDA and CPU buffers, and the byte span of
anything a stream can copy.

Nothing here imports torch: a torch view is asked of a buffer only by code that uses torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
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
    shape, length = byte_range(flat.numel(), dtype.itemsize, shape, offset)
    return flat[offset : offset + length].view(dtype).view(shape)


def numpy_view(
    flat: np.ndarray, dtype: Any, shape: tuple[int, ...] | None, offset: int
) -> np.ndarray:
    """View a flat uint8 array as ``dtype`` with ``shape`` starting at byte ``offset``."""
    dt = np.dtype(dtype)
    shape, length = byte_range(flat.size, dt.itemsize, shape, offset)
    return flat[offset : offset + length].view(dt).reshape(shape)


def byte_span(obj: Any) -> tuple[int, int]:
    """(address, bytes) of a runtime buffer, a contiguous torch tensor or numpy array, or an
    object with a contiguous ``__cuda_array_interface__``."""
    if hasattr(obj, "ptr") and hasattr(obj, "nbytes"):  # a runtime buffer
        if getattr(obj, "closed", False):
            raise ValueError(f"{type(obj).__name__} is closed")
        return int(obj.ptr), int(obj.nbytes)
    if hasattr(obj, "data_ptr"):  # a torch tensor
        if not obj.is_contiguous():
            raise ValueError("copy needs contiguous tensors")
        return int(obj.data_ptr()), obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise ValueError("copy needs contiguous arrays")
        return int(obj.ctypes.data), int(obj.nbytes)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        itemsize = np.dtype(cai["typestr"]).itemsize
        shape = tuple(cai["shape"])
        strides = cai.get("strides")
        if strides is not None and tuple(strides) != _c_strides(shape, itemsize):
            raise ValueError("copy needs contiguous arrays")
        return int(cai["data"][0]), _numel(shape) * itemsize
    raise TypeError(f"cannot copy to or from a {type(obj).__name__}")


def copy_span(dst: Any, src: Any, nbytes: int | None) -> tuple[int, int, int]:
    """(dst address, src address, bytes) of a copy of ``nbytes`` (default: all of ``src``),
    checked against the size of both sides."""
    dst_ptr, dst_size = byte_span(dst)
    src_ptr, src_size = byte_span(src)
    n = src_size if nbytes is None else nbytes
    if not 0 <= n <= src_size or n > dst_size:
        raise ValueError(
            f"cannot copy {n} bytes from a {src_size}-byte source to a {dst_size}-byte destination"
        )
    return dst_ptr, src_ptr, n


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for s in reversed(shape):
        strides.append(step)
        step *= s
    return tuple(reversed(strides))


class TorchViews:
    """Torch views of a buffer of ``nbytes`` bytes, given its flat uint8 tensor; closing."""

    nbytes: int
    closed: bool
    _what = "buffer"

    def _flat_torch(self) -> torch.Tensor:
        raise NotImplementedError

    def torch(
        self, dtype: torch.dtype | None = None, shape: tuple[int, ...] | None = None,
        offset: int = 0,
    ) -> torch.Tensor:
        """A zero-copy ``dtype`` (default uint8) view of ``shape`` at byte ``offset``."""
        self._check_open()
        if dtype is None:
            import torch

            dtype = torch.uint8
        return torch_view(self._flat_torch(), dtype, shape, offset)

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"the {self._what} is closed")

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HostViews(TorchViews):
    """Torch and numpy views of a host buffer."""

    def _flat_numpy(self) -> np.ndarray:
        raise NotImplementedError

    def numpy(
        self, dtype: Any = np.uint8, shape: tuple[int, ...] | None = None, offset: int = 0
    ) -> np.ndarray:
        """A zero-copy numpy view of ``shape`` at byte ``offset``."""
        self._check_open()
        return numpy_view(self._flat_numpy(), dtype, shape, offset)
