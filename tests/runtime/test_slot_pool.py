from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from cadence.runtime import CpuDevice, SlotPoolExhausted
from cadence.runtime.slot_pool import SlotPool


class CountingDevice(CpuDevice):
    def __init__(self) -> None:
        self.calls: dict[str, int] = {"alloc_device": 0, "alloc_pinned": 0, "create_event": 0}

    def alloc_device(self, nbytes: int) -> Any:
        self.calls["alloc_device"] += 1
        return super().alloc_device(nbytes)

    def alloc_pinned(self, nbytes: int) -> Any:
        self.calls["alloc_pinned"] += 1
        return super().alloc_pinned(nbytes)

    def create_event(self, timing: bool = False) -> Any:
        self.calls["create_event"] += 1
        return super().create_event(timing)


def test_borrow_release_cycle_allocates_only_at_construction() -> None:
    dev = CountingDevice()
    main, copy = dev.create_stream(), dev.create_stream()
    with dev.create_slot_pool(num_slots=3, capacity=16) as pool:
        built = dict(dev.calls)
        assert built == {"alloc_device": 3, "alloc_pinned": 3, "create_event": 6}
        src = torch.zeros(16, dtype=torch.int64)
        for step in range(2000):
            slot = pool.borrow()
            n = step % 17
            src[:n] = torch.arange(step, step + n)
            slot.stage(src, n, main, copy)
            np.testing.assert_array_equal(slot.fetch(n), np.arange(step, step + n))
            pool.release(slot)
        assert dev.calls == built


def test_pool_lends_each_slot_once_and_raises_when_empty() -> None:
    pool = CpuDevice().create_slot_pool(num_slots=2, capacity=4)
    a, b = pool.borrow(), pool.borrow()
    assert a is not b and pool.num_free == 0
    with pytest.raises(SlotPoolExhausted):
        pool.borrow()
    pool.release(a)
    with pytest.raises(ValueError, match="released twice"):
        pool.release(a)
    assert pool.borrow() is a
    other = CpuDevice().create_slot_pool(num_slots=2, capacity=4)
    with pytest.raises(ValueError, match="belong"):
        other.release(b)
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        pool.borrow()


def test_staged_values_survive_overwriting_the_source() -> None:
    dev = CpuDevice()
    s = dev.create_stream()
    pool = dev.create_slot_pool(num_slots=2, capacity=8)
    src = torch.arange(8, dtype=torch.int64)
    first = pool.borrow()
    first.stage(src, 8, s, s)
    src.fill_(-1)  # the next step's sampler output
    second = pool.borrow()
    second.stage(src, 3, s, s)
    assert first.fetch(8).tolist() == list(range(8))
    assert second.fetch(3).tolist() == [-1, -1, -1]
    with pytest.raises(TypeError):
        first.stage(src.int(), 2, s, s)
    with pytest.raises(ValueError):
        first.stage(src, 9, s, s)


@pytest.mark.gpu
def test_ten_thousand_cycles_make_no_cuda_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda.bindings import runtime as rt

    from cadence.runtime import get_device

    counts = {"cudaHostAlloc": 0, "cudaMalloc": 0, "cudaEventCreateWithFlags": 0}

    def counting(name: str) -> Any:
        original = getattr(rt, name)

        def wrapper(*args: Any) -> Any:
            counts[name] += 1
            return original(*args)

        return wrapper

    for name in counts:
        monkeypatch.setattr(rt, name, counting(name))
    dev = get_device("cuda")
    main, copy = dev.create_stream(), dev.create_stream()
    pool = dev.create_slot_pool(num_slots=4, capacity=256)
    built = dict(counts)
    assert built["cudaHostAlloc"] == 4 and built["cudaMalloc"] == 4
    src = torch.arange(256, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()  # src was made on torch's stream, which main does not wait for
    for step in range(10_000):
        slot = pool.borrow()
        n = 1 + step % 256
        slot.stage(src, n, main, copy)
        if step % 1000 == 0:
            assert slot.fetch(n).tolist() == list(range(n))
        pool.release(slot)
    main.synchronize()
    copy.synchronize()
    assert counts == built
    pool.close()
    main.close()
    copy.close()


def test_slots_are_lent_in_the_order_they_came_back() -> None:
    """The slot lent next is the one returned longest ago: its host copy has had the most time
    to finish, so borrow() rarely waits."""
    pool = CpuDevice().create_slot_pool(num_slots=3, capacity=4)
    a, b, c = pool.borrow(), pool.borrow(), pool.borrow()
    for slot in (b, c, a):
        pool.release(slot)
    assert [pool.borrow() for _ in range(3)] == [b, c, a]


def test_fetched_values_are_a_copy() -> None:
    dev = CpuDevice()
    s = dev.create_stream()
    pool = dev.create_slot_pool(num_slots=1, capacity=4)
    slot = pool.borrow()
    slot.stage(torch.tensor([1, 2, 3, 4]), 4, s, s)
    first = slot.fetch(4)
    pool.release(slot)
    again = pool.borrow()
    again.stage(torch.tensor([9, 9, 9, 9]), 4, s, s)
    assert first.tolist() == [1, 2, 3, 4] and again.fetch(2).tolist() == [9, 9]


class _Log:
    """Streams and events that log what is done to them, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def stream(self, name: str) -> Any:
        log = self.calls
        base = CpuDevice().create_stream()

        class Stream:
            def copy_ptr_async(self, dst: int, src: int, nbytes: int) -> None:
                log.append((name, "copy"))
                base.copy_ptr_async(dst, src, nbytes)

            def wait(self, event: Any) -> None:
                log.append((name, f"wait {event.name}"))

        return Stream()


class _LoggedDevice(CpuDevice):
    def __init__(self, log: _Log) -> None:
        self.log = log
        self.events = 0

    def create_event(self, timing: bool = False) -> Any:
        log, name = self.log.calls, ("produced", "ready")[self.events % 2]
        self.events += 1

        class Event:
            def __init__(self) -> None:
                self.name = name

            def record(self, stream: Any) -> None:
                log.append((self.name, "record"))

            def synchronize(self) -> None:
                log.append((self.name, "synchronize"))

            def close(self) -> None:
                pass

        return Event()


def test_stage_orders_the_copy_after_the_snapshot_and_borrow_waits_for_it() -> None:
    """stage: snapshot on main, record `produced` there, the copy stream waits on it, copies,
    records `ready`; borrow and fetch wait on `ready` (DESIGN: the D2H copy waits on an event
    recorded on the main stream; get_output waits only on that copy's event)."""
    log = _Log()
    pool = SlotPool(_LoggedDevice(log), num_slots=1, capacity=4)
    main, copy = log.stream("main"), log.stream("copy")
    slot = pool.borrow()
    assert log.calls == [("ready", "synchronize")]
    log.calls.clear()
    slot.stage(torch.tensor([4, 5, 6, 7]), 3, main, copy)
    assert log.calls == [("main", "copy"), ("produced", "record"), ("copy", "wait produced"),
                         ("copy", "copy"), ("ready", "record")]
    log.calls.clear()
    assert slot.fetch(3).tolist() == [4, 5, 6]
    assert log.calls == [("ready", "synchronize")]


def test_releasing_a_slot_never_lent_or_building_an_empty_pool_is_refused() -> None:
    pool = CpuDevice().create_slot_pool(num_slots=2, capacity=4)
    with pytest.raises(ValueError, match="slot 1 is not lent out"):
        pool.release(pool.slots[1])
    for slots, capacity in ((0, 4), (2, 0), (0, 0)):
        with pytest.raises(ValueError, match="num_slots and capacity must be >= 1"):
            CpuDevice().create_slot_pool(num_slots=slots, capacity=capacity)
