from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from cadence.runtime import CpuDevice, SlotPoolExhausted


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
