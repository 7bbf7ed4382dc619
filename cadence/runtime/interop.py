"""Optional cupy interop: zero-copy cupy views of runtime buffers and DLPack exchange.

Imported only when used; needs ``cupy`` (``cupy-cuda12x``/``cupy-cuda13x``). Views alias the
buffer's memory and become dangling once the buffer is closed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cadence.runtime._cudart import cudart
from cadence.runtime.buffers import DeviceBuffer, PinnedBuffer
from cadence.runtime.errors import check
from cadence.runtime.views import byte_range

if TYPE_CHECKING:
    import torch


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("cupy interop needs cupy (pip install 'cadence[cuda13]' or 'cadence[cuda12]', for your CUDA major)") from exc
    return cupy


def cupy_view(
    buffer: DeviceBuffer | PinnedBuffer,
    dtype: Any = "uint8",
    shape: tuple[int, ...] | None = None,
    offset: int = 0,
    device_index: int = 0,
) -> Any:
    """A ``cupy.ndarray`` over a runtime buffer, without copying.

    For a ``PinnedBuffer`` the array uses the mapped device address of the page-locked memory
    (``cudaHostGetDevicePointer``): kernels read and write host memory over the bus.
    """
    cp = _cupy()
    dt = cp.dtype(dtype)
    shape, _ = byte_range(buffer.nbytes, dt.itemsize, shape, offset)
    if isinstance(buffer, PinnedBuffer):
        ptr = int(
            check(cudart().cudaHostGetDevicePointer(buffer.ptr, 0), "cudaHostGetDevicePointer")
        )
    elif isinstance(buffer, DeviceBuffer):
        ptr = buffer.ptr
        device_index = buffer.device_index
    else:
        raise TypeError(f"expected a PinnedBuffer or DeviceBuffer, got {type(buffer).__name__}")
    memory = cp.cuda.UnownedMemory(ptr, buffer.nbytes, buffer, device_index)
    return cp.ndarray(shape, dtype=dt, memptr=cp.cuda.MemoryPointer(memory, offset))


def to_cupy(tensor: torch.Tensor) -> Any:
    """A cupy array sharing a CUDA tensor's memory (DLPack)."""
    return _cupy().from_dlpack(tensor)


def to_torch(array: Any) -> torch.Tensor:
    """A torch tensor sharing a cupy array's memory (DLPack)."""
    import torch

    return torch.from_dlpack(array)
