"""The compute capability of a CUDA device, asked of the driver once per device: the kernels'
tables (bulk GEMV, split-K) are measured on one capability and checked against it per call."""

from __future__ import annotations

import torch

__all__ = ["device_capability"]

_CAPABILITY: dict[int, tuple[int, int]] = {}


def device_capability(device: torch.device) -> tuple[int, int]:
    """``torch.cuda.get_device_capability`` of ``device`` (the current device for ``cuda``)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    found = _CAPABILITY.get(index)
    if found is None:
        found = _CAPABILITY[index] = torch.cuda.get_device_capability(index)
    return found
