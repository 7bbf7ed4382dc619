"""Pinned host memory (``cudaHostAlloc``) and raw device memory (``cudaMalloc``).

Views returned by ``numpy()`` / ``torch()`` alias the buffer: they are zero-copy and become
dangling once the buffer is closed. Keep the buffer open for as long as any view is used.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import torch

from cadence.runtime._cudart import cudart
from cadence.runtime.errors import check
from cadence.runtime.views import numpy_view, torch_view


class PinnedBuffer:
    """Page-locked host memory from ``cudaHostAlloc``; async copies from/to it are truly async."""

    def __init__(self, nbytes: int, flags: int | None = None) -> None:
        if nbytes < 1:
            raise ValueError(f"nbytes must be at least 1, got {nbytes}")
        rt = cudart()
        self._rt = rt
        self.nbytes = nbytes
        self.flags = rt.cudaHostAllocDefault if flags is None else flags
        self.ptr: int = int(check(rt.cudaHostAlloc(nbytes, self.flags), "cudaHostAlloc"))
        self._raw = (ctypes.c_uint8 * nbytes).from_address(self.ptr)
        self._flat_np = np.frombuffer(self._raw, dtype=np.uint8)
        self._flat_torch = torch.frombuffer(self._raw, dtype=torch.uint8)
        self.closed = False

    def numpy(
        self, dtype: Any = np.uint8, shape: tuple[int, ...] | None = None, offset: int = 0
    ) -> np.ndarray:
        self._check_open()
        return numpy_view(self._flat_np, dtype, shape, offset)

    def torch(
        self,
        dtype: torch.dtype = torch.uint8,
        shape: tuple[int, ...] | None = None,
        offset: int = 0,
    ) -> torch.Tensor:
        self._check_open()
        return torch_view(self._flat_torch, dtype, shape, offset)

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("the pinned buffer is closed")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._flat_np = np.empty(0, np.uint8)
        self._flat_torch = torch.empty(0, dtype=torch.uint8)
        self._raw = None
        check(self._rt.cudaFreeHost(self.ptr), "cudaFreeHost")

    def __enter__(self) -> PinnedBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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


class DeviceBuffer:
    """Device memory from ``cudaMalloc``, owned by cadence rather than torch's caching allocator.

    ``torch()`` wraps the memory zero-copy through the CUDA array interface; the buffer itself
    also exposes ``__cuda_array_interface__`` (uint8, ``nbytes`` long) for numba and cupy.
    Closing the buffer frees the memory and invalidates every view.
    """

    def __init__(self, nbytes: int, device_index: int = 0) -> None:
        if nbytes < 1:
            raise ValueError(f"nbytes must be at least 1, got {nbytes}")
        rt = cudart()
        self._rt = rt
        self.nbytes = nbytes
        self.device_index = device_index
        self.ptr: int = int(check(rt.cudaMalloc(nbytes), "cudaMalloc"))
        self.closed = False
        self._flat: torch.Tensor | None = None

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        self._check_open()
        return _ArrayInterface(self.ptr, self.nbytes, self).__cuda_array_interface__

    def _flat_tensor(self) -> torch.Tensor:
        if self._flat is None:
            # No back-reference to self: the memory's lifetime is close(), not garbage collection.
            carrier = _ArrayInterface(self.ptr, self.nbytes, None)
            device = torch.device("cuda", self.device_index)
            self._flat = torch.as_tensor(carrier, device=device)
        return self._flat

    def torch(
        self,
        dtype: torch.dtype = torch.uint8,
        shape: tuple[int, ...] | None = None,
        offset: int = 0,
    ) -> torch.Tensor:
        self._check_open()
        return torch_view(self._flat_tensor(), dtype, shape, offset)

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("the device buffer is closed")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._flat = None
        check(self._rt.cudaFree(self.ptr), "cudaFree")

    def __enter__(self) -> DeviceBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DeviceBuffer(nbytes={self.nbytes}, ptr={self.ptr:#x}, closed={self.closed})"
