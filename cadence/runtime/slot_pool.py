"""A fixed pool of device→host staging slots for asynchronous step outputs.

Each slot holds a device buffer, a pinned host buffer of the same size, and two events:
``produced`` (recorded on the main stream once the device buffer holds the step's values) and
``ready`` (recorded on the copy stream once the host buffer holds them). Everything is allocated
when the pool is built; ``borrow``/``release`` and ``Slot.stage`` allocate and create nothing.

The cycle of one step::

    slot = pool.borrow()
    slot.stage(sampled_ids, n, main=main_stream, copy=copy_stream)   # no host blocking
    ...                                                             # next step is launched
    ids = slot.fetch(n)                                               # waits on slot.ready only
    pool.release(slot)
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

    from cadence.runtime.interfaces import (
        BufferLike,
        DeviceLike,
        EventLike,
        HostBufferLike,
        StreamLike,
    )


class SlotPoolExhausted(RuntimeError):
    """``borrow()`` on a pool whose slots are all lent out."""


class Slot:
    """One staging slot; use only between ``SlotPool.borrow`` and ``SlotPool.release``."""

    def __init__(
        self,
        index: int,
        capacity: int,
        dtype: torch.dtype,
        device_buffer: BufferLike,
        host_buffer: HostBufferLike,
        produced: EventLike,
        ready: EventLike,
    ) -> None:
        self.index = index
        self.capacity = capacity
        self.dtype = dtype
        self.itemsize = dtype.itemsize
        self._device_buffer = device_buffer
        self._host_buffer = host_buffer
        self.device_ids = device_buffer.torch(dtype, (capacity,))
        self.host = host_buffer.torch(dtype, (capacity,))
        self.produced = produced
        self.ready = ready

    def stage(self, src: torch.Tensor, n: int, main: StreamLike, copy: StreamLike) -> None:
        """Snapshot ``src[:n]`` into the slot on ``main``, then copy it to the host on ``copy``.

        ``src`` must be contiguous with the slot's dtype and live on the slot's device; the
        snapshot is ordered after the work already queued on ``main`` (the sampler), so ``src``
        may be overwritten by the next step while the host copy is still in flight.
        """
        if not 0 <= n <= self.capacity:
            raise ValueError(f"n={n} outside the slot's capacity {self.capacity}")
        if src.dtype != self.dtype:
            raise TypeError(f"slot holds {self.dtype}, got {src.dtype}")
        nbytes = n * self.itemsize
        if nbytes:
            main.copy_ptr_async(self._device_buffer.ptr, src.data_ptr(), nbytes)
        self.produced.record(main)
        copy.wait(self.produced)
        if nbytes:
            copy.copy_ptr_async(self._host_buffer.ptr, self._device_buffer.ptr, nbytes)
        self.ready.record(copy)

    def fetch(self, n: int) -> np.ndarray:
        """Wait for the host copy and return its first ``n`` values as a fresh numpy array."""
        self.ready.synchronize()
        return self.host[:n].numpy().copy()


class SlotPool:
    """``num_slots`` persistent slots of ``capacity`` elements of ``dtype`` (a torch dtype,
    torch.int64 if None) each. The slots' views are torch tensors: a pool needs torch."""

    def __init__(
        self,
        device: DeviceLike,
        num_slots: int,
        capacity: int,
        dtype: Any = None,
    ) -> None:
        if num_slots < 1 or capacity < 1:
            raise ValueError(f"num_slots and capacity must be >= 1, got {num_slots}, {capacity}")
        if dtype is None:
            import torch

            dtype = torch.int64
        self.num_slots = num_slots
        self.capacity = capacity
        self.dtype = dtype
        itemsize = dtype.itemsize
        self._resources: list[BufferLike | EventLike] = []
        self.slots: list[Slot] = []
        for i in range(num_slots):
            dev = device.alloc_device(capacity * itemsize)
            host = device.alloc_pinned(capacity * itemsize)
            produced = device.create_event()
            ready = device.create_event()
            self._resources += [dev, host, produced, ready]
            self.slots.append(Slot(i, capacity, dtype, dev, host, produced, ready))
        self._free: deque[int] = deque(range(num_slots))
        self._lent = [False] * num_slots
        self.closed = False

    @property
    def num_free(self) -> int:
        return len(self._free)

    def borrow(self) -> Slot:
        """Lend a slot; waits for that slot's previous host copy (normally long complete)."""
        if self.closed:
            raise ValueError("the slot pool is closed")
        if not self._free:
            raise SlotPoolExhausted(f"all {self.num_slots} slots are lent out")
        index = self._free.popleft()
        self._lent[index] = True
        slot = self.slots[index]
        slot.ready.synchronize()
        return slot

    def release(self, slot: Slot) -> None:
        """Return a slot; its host data may be overwritten by the next borrower."""
        if slot.index >= self.num_slots or self.slots[slot.index] is not slot:
            raise ValueError("the slot does not belong to this pool")
        if not self._lent[slot.index]:
            raise ValueError(f"slot {slot.index} is not lent out (released twice?)")
        self._lent[slot.index] = False
        self._free.append(slot.index)

    def close(self) -> None:
        """Free every buffer and event. Outstanding copies must have completed."""
        if self.closed:
            return
        self.closed = True
        for slot in self.slots:
            slot.ready.synchronize()
        for resource in self._resources:
            resource.close()
        self._resources.clear()

    def __enter__(self) -> SlotPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
