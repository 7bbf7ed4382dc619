"""Pinned host memory (``cudaHostAlloc``) and raw device memory (``cudaMalloc``).

Views returned by ``numpy()`` / ``torch()`` alias the buffer: they are zero-copy and become
dangling once the buffer is closed. Keep the buffer open for as long as any view is used.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import numpy as np

from cadence.runtime._cudart import cudart, on_device
from cadence.runtime.errors import check
from cadence.runtime.views import HostViews, TorchViews

if TYPE_CHECKING:
    import torch


class PinnedBuffer(HostViews):
    """Page-locked host memory from ``cudaHostAlloc``; async copies from/to it are truly async."""

    _what = "pinned buffer"

    def __init__(self, nbytes: int, flags: int | None = None) -> None:
        if nbytes < 1:
            raise ValueError(f"nbytes must be at least 1, got {nbytes}")
        rt = cudart()
        self._rt = rt
        self.nbytes = nbytes
        self.flags = rt.cudaHostAllocDefault if flags is None else flags
        self.ptr: int = int(check(rt.cudaHostAlloc(nbytes, self.flags), "cudaHostAlloc"))
        self._raw: Any = (ctypes.c_uint8 * nbytes).from_address(self.ptr)
        self._flat_np = np.frombuffer(self._raw, dtype=np.uint8)
        self._flat: torch.Tensor | None = None
        self.closed = False

    def _flat_numpy(self) -> np.ndarray:
        return self._flat_np

    def _flat_torch(self) -> torch.Tensor:
        if self._flat is None:
            import torch

            self._flat = torch.frombuffer(self._raw, dtype=torch.uint8)
        return self._flat

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._flat_np = np.empty(0, np.uint8)
        self._flat = None
        self._raw = None
        check(self._rt.cudaFreeHost(self.ptr), "cudaFreeHost")

    def __repr__(self) -> str:
        return f"PinnedBuffer(nbytes={self.nbytes}, ptr={self.ptr:#x}, closed={self.closed})"


class _ArrayInterface:
    """A ``__cuda_array_interface__`` (v3) carrier through which torch/numba/cupy wrap memory."""

    def __init__(self, ptr: int, nbytes: int, owner: object) -> None:
        self.owner = owner  # keeps the buffer object alive as long as a consumer holds this
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "strides": None,
            "version": 3,
            "stream": None,  # the producer has no pending work to order against
        }


class DeviceBuffer(TorchViews):
    """Device memory from ``cudaMalloc`` on device ``device_index``, owned by cadence rather
    than torch's caching allocator.

    ``torch()`` wraps the memory zero-copy through the CUDA array interface; the buffer itself
    also exposes ``__cuda_array_interface__`` (uint8, ``nbytes`` long) for numba and cupy.
    Closing the buffer frees the memory and invalidates every view.
    """

    _what = "device buffer"

    def __init__(self, nbytes: int, device_index: int = 0) -> None:
        if nbytes < 1:
            raise ValueError(f"nbytes must be at least 1, got {nbytes}")
        rt = cudart()
        self._rt = rt
        self.nbytes = nbytes
        self.device_index = device_index
        with on_device(device_index):
            self.ptr: int = int(check(rt.cudaMalloc(nbytes), "cudaMalloc"))
        self.closed = False
        self._flat: torch.Tensor | None = None

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        self._check_open()
        return _ArrayInterface(self.ptr, self.nbytes, self).__cuda_array_interface__

    def _flat_torch(self) -> torch.Tensor:
        if self._flat is None:
            import torch

            # No back-reference to self: the memory's lifetime is close(), not garbage collection.
            carrier = _ArrayInterface(self.ptr, self.nbytes, None)
            self._flat = torch.as_tensor(carrier, device=torch.device("cuda", self.device_index))
        return self._flat

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._flat = None
        with on_device(self.device_index):
            check(self._rt.cudaFree(self.ptr), "cudaFree")

    def __repr__(self) -> str:
        return f"DeviceBuffer(nbytes={self.nbytes}, ptr={self.ptr:#x}, closed={self.closed})"
