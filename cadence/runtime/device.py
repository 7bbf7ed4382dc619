"""The CUDA device: properties, memory info, and the factory for streams, events and buffers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from cadence.runtime._cudart import cudart, on_device
from cadence.runtime.buffers import DeviceBuffer, PinnedBuffer
from cadence.runtime.errors import NoCudaDeviceError, check
from cadence.runtime.event import Event
from cadence.runtime.interfaces import DeviceProperties
from cadence.runtime.slot_pool import SlotPool
from cadence.runtime.stream import Stream

if TYPE_CHECKING:
    import torch

    from cadence.runtime.cpu import CpuDevice


class Device:
    """One CUDA device, driven through ``cuda.bindings.runtime``."""

    kind = "cuda"

    def __init__(self, index: int = 0) -> None:
        self._rt = cudart()
        count = _device_count(self._rt)
        if not 0 <= index < count:
            raise ValueError(f"device index {index} out of range ({count} devices)")
        self.index = index
        self._properties: DeviceProperties | None = None

    @property
    def torch_device(self) -> torch.device:
        import torch

        return torch.device("cuda", self.index)

    def select(self) -> Device:
        """Make this the current device of the calling thread (for cudart and torch alike)."""
        check(self._rt.cudaSetDevice(self.index), "cudaSetDevice")
        return self

    def properties(self) -> DeviceProperties:
        if self._properties is None:
            prop = check(self._rt.cudaGetDeviceProperties(self.index), "cudaGetDeviceProperties")
            name = prop.name
            if isinstance(name, bytes):
                name = name.split(b"\0", 1)[0].decode()
            self._properties = DeviceProperties(
                name=str(name),
                total_memory=int(prop.totalGlobalMem),
                multiprocessor_count=int(prop.multiProcessorCount),
                compute_capability=(int(prop.major), int(prop.minor)),
                l2_cache_size=int(prop.l2CacheSize),
                warp_size=int(prop.warpSize),
            )
        return self._properties

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory."""
        with on_device(self.index):
            free, total = check(self._rt.cudaMemGetInfo(), "cudaMemGetInfo")
        return int(free), int(total)

    def stream_priority_range(self) -> tuple[int, int]:
        """(least, greatest) stream priority; numerically lower is higher priority."""
        with on_device(self.index):
            least, greatest = check(
                self._rt.cudaDeviceGetStreamPriorityRange(), "cudaDeviceGetStreamPriorityRange"
            )
        return int(least), int(greatest)

    # The factories select this device for the calling thread, as get_device() did: a thread
    # that makes its streams here then runs torch on this device too.
    def create_stream(self, priority: int | None = None) -> Stream:
        self.select()
        return Stream(self.index, priority)

    def create_event(self, timing: bool = False) -> Event:
        self.select()
        return Event(timing, self.index)

    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        return PinnedBuffer(nbytes)

    def alloc_device(self, nbytes: int) -> DeviceBuffer:
        self.select()
        return DeviceBuffer(nbytes, self.index)

    def create_slot_pool(self, num_slots: int, capacity: int, dtype: Any = None) -> SlotPool:
        """``num_slots`` staging slots of ``capacity`` elements of ``dtype`` (torch.int64 if None)."""
        return SlotPool(self, num_slots, capacity, dtype)

    def synchronize(self) -> None:
        with on_device(self.index):
            check(self._rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def __repr__(self) -> str:
        return f"Device(cuda:{self.index})"


def _device_count(rt: object) -> int:
    """The number of CUDA devices; on a machine without any, an error that says so (cudart
    reports a missing driver as an insufficient one)."""
    status, count = rt.cudaGetDeviceCount()  # type: ignore[attr-defined]
    if int(status) == 0 and count > 0:
        return int(count)
    name = getattr(status, "name", str(status))
    if int(status) == 0 or name in ("cudaErrorNoDevice", "cudaErrorInsufficientDriver"):
        raise NoCudaDeviceError(
            f"there is no CUDA device here (cudaGetDeviceCount: {name}); "
            "use the CPU backend, get_device('cpu')"
        )
    return check((status, count), "cudaGetDeviceCount")


def get_device(kind: Literal["cpu", "cuda"] = "cuda", index: int = 0) -> Device | CpuDevice:
    """The runtime backend for ``kind``: a selected CUDA ``Device`` or the ``CpuDevice``."""
    if kind == "cuda":
        return Device(index).select()
    if kind == "cpu":
        from cadence.runtime.cpu import CpuDevice

        return CpuDevice()
    raise ValueError(f"kind must be 'cpu' or 'cuda', got {kind!r}")
