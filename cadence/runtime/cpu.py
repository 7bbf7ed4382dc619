"""The CPU backend: the runtime's contract degenerated to synchronous host work.

Events are complete as soon as they are recorded, copies happen at once, streams are ordering-
free, and buffers are plain host memory. Code written against the CUDA backend runs unchanged,
with one exception: a captured block runs once, eagerly, and its ``CpuGraph`` cannot be
replayed (re-run the step instead: ``cadence.graphs.EagerGraphBackend`` does).
"""

from __future__ import annotations

import ctypes
import os
import platform
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cadence.runtime.interfaces import DeviceProperties, EventLike, StreamLike
from cadence.runtime.slot_pool import SlotPool
from cadence.runtime.views import HostViews, copy_span

if TYPE_CHECKING:
    import torch


class CpuEvent:
    def __init__(self, timing: bool = False) -> None:
        self.timing = timing
        self.handle = None
        self._time: float | None = None
        self.closed = False

    def record(self, stream: StreamLike) -> CpuEvent:
        self._time = time.perf_counter()
        return self

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_ms(self, end: EventLike) -> float:
        if not (self.timing and end.timing):
            raise ValueError("elapsed_ms needs two events created with timing=True")
        end_time = getattr(end, "_time", None)
        if self._time is None or end_time is None:
            raise ValueError("elapsed_ms needs both events recorded")
        return (end_time - self._time) * 1e3

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> CpuEvent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CpuGraph:
    """What a capture on the CPU backend gives: the block already ran; there is nothing to
    replay, inspect or dump."""

    handle = None
    exec_handle = None
    pool = None

    def __init__(self) -> None:
        self.closed = False

    def launch(self, stream: StreamLike) -> None:
        raise RuntimeError(
            "the CPU backend ran the captured block once, eagerly, and cannot replay it; run "
            "the step again instead (cadence.graphs.EagerGraphBackend does)"
        )

    def node_counts(self) -> dict[str, int]:
        return {}

    @property
    def kernel_count(self) -> int:
        return 0

    def to_dot(self, path: str | Path, verbose: bool = True) -> Path:
        raise RuntimeError("the CPU backend captures no graph to dump")

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> CpuGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CpuStream:
    def __init__(self, priority: int | None = None) -> None:
        self.priority = priority
        self.device_index = 0
        self.handle = None
        self.ptr = 0
        self.closed = False

    @property
    def torch(self) -> Any:
        return None

    def context(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def wait(self, other: EventLike | StreamLike) -> None:
        return None

    def record(self, event: EventLike | None = None) -> EventLike:
        ev = event if event is not None else CpuEvent()
        ev.record(self)
        return ev

    def copy(self, dst: Any, src: Any, nbytes: int | None = None) -> None:
        self.copy_ptr_async(*copy_span(dst, src, nbytes))

    def copy_ptr_async(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            ctypes.memmove(dst, src, nbytes)

    def copy_2d_ptr_async(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int,
                          height: int) -> None:
        for row in range(height if width else 0):
            ctypes.memmove(dst + row * dst_pitch, src + row * src_pitch, width)

    @contextmanager
    def capture(self, pool: Any = None, mode: str = "thread_local") -> Iterator[CpuGraph]:
        yield CpuGraph()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> CpuStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CpuBuffer(HostViews):
    """Plain host memory standing in for both pinned and device buffers."""

    def __init__(self, nbytes: int) -> None:
        if nbytes < 1:
            raise ValueError(f"nbytes must be at least 1, got {nbytes}")
        self.nbytes = nbytes
        self._flat_np = np.empty(nbytes, dtype=np.uint8)
        self._flat: torch.Tensor | None = None
        self.ptr = int(self._flat_np.ctypes.data)
        self.closed = False

    def _flat_numpy(self) -> np.ndarray:
        return self._flat_np

    def _flat_torch(self) -> torch.Tensor:
        if self._flat is None:
            import torch

            self._flat = torch.from_numpy(self._flat_np)
        return self._flat

    def close(self) -> None:
        # Views keep the array's memory alive, so closing only forbids new views.
        self.closed = True


class CpuDevice:
    kind = "cpu"
    index = 0

    @property
    def torch_device(self) -> torch.device:
        import torch

        return torch.device("cpu")

    def select(self) -> CpuDevice:
        return self

    def properties(self) -> DeviceProperties:
        """The host as a device: its processor, memory and cores (no compute capability)."""
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        return DeviceProperties(name=platform.processor() or platform.machine() or "cpu",
                                total_memory=int(total), multiprocessor_count=cores,
                                compute_capability=(0, 0), l2_cache_size=0, warp_size=1)

    def stream_priority_range(self) -> tuple[int, int]:
        """(least, greatest) stream priority: one level, streams are ordering-free here."""
        return 0, 0

    def mem_get_info(self) -> tuple[int, int]:
        pages = os.sysconf("SC_PHYS_PAGES")
        free_pages = os.sysconf("SC_AVPHYS_PAGES")
        page = os.sysconf("SC_PAGE_SIZE")
        return free_pages * page, pages * page

    def create_stream(self, priority: int | None = None) -> CpuStream:
        return CpuStream(priority)

    def create_event(self, timing: bool = False) -> CpuEvent:
        return CpuEvent(timing)

    def alloc_pinned(self, nbytes: int) -> CpuBuffer:
        return CpuBuffer(nbytes)

    def alloc_device(self, nbytes: int) -> CpuBuffer:
        return CpuBuffer(nbytes)

    def create_slot_pool(self, num_slots: int, capacity: int, dtype: Any = None) -> SlotPool:
        return SlotPool(self, num_slots, capacity, dtype)

    def synchronize(self) -> None:
        return None

    def __repr__(self) -> str:
        return "CpuDevice()"
