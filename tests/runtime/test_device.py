"""The CUDA backend on a real device: streams, events, buffers and their ordering."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture
def dev():
    from cadence.runtime import get_device

    return get_device("cuda")


def test_properties_and_memory(dev) -> None:
    props = dev.properties()
    assert props.multiprocessor_count > 0 and props.total_memory > 1 << 30
    assert props.compute_capability >= (7, 0)
    free, total = dev.mem_get_info()
    assert 0 < free <= total
    least, greatest = dev.stream_priority_range()
    assert greatest <= least


def test_stream_wait_orders_work_across_streams(dev) -> None:
    a, b = dev.create_stream(), dev.create_stream(priority=dev.stream_priority_range()[1])
    x = torch.zeros(1 << 20, device="cuda")
    y = torch.empty_like(x)
    torch.cuda.synchronize()
    for round_ in range(1, 4):
        with a.context():
            torch.cuda._sleep(2_000_000)  # ~1 ms: b would overtake without the wait
            x.fill_(round_)
        b.wait(a)
        with b.context():
            y.copy_(x)
        b.synchronize()
        assert float(y.min()) == round_
    ev = a.record()
    ev.wait(b)
    ev.synchronize()
    assert ev.query() and a.query()
    assert isinstance(a.torch, torch.cuda.ExternalStream) and a.torch.cuda_stream == a.ptr
    ev.close()
    a.close()
    b.close()


def test_timing_events(dev) -> None:
    s = dev.create_stream()

    def spin(cycles: int) -> float:
        start, end = dev.create_event(timing=True), dev.create_event(timing=True)
        start.record(s)
        with s.context():
            torch.cuda._sleep(cycles)
        end.record(s)
        end.synchronize()
        return start.elapsed_ms(end)

    spin(1_000)  # warm-up
    short, long = spin(1_000_000), spin(16_000_000)
    # Sixteen times the device-side spin reads as clearly longer (no wall-clock bound).
    assert 0 < short < long and long > 4 * short, (short, long)
    with pytest.raises(ValueError):
        dev.create_event().elapsed_ms(dev.create_event(timing=True))
    s.close()


def test_pinned_and_device_buffers_round_trip(dev) -> None:
    s = dev.create_stream()
    with dev.alloc_pinned(4096) as host, dev.alloc_device(4096) as device:
        src = host.numpy(np.float32)
        src[:] = np.random.default_rng(0).standard_normal(1024, dtype=np.float32)
        s.copy_async(device.ptr, host.ptr, 4096)
        d = device.torch(torch.float32, (32, 32))
        assert d.is_cuda and d.data_ptr() == device.ptr
        with s.context():
            d.mul_(2.0)
        back = host.torch(torch.float32, (32, 32))
        s.copy_async(host.ptr, device.ptr, 4096)
        s.synchronize()
        np.testing.assert_array_equal(back.numpy().ravel(), src)  # aliasing: same memory
        assert back.is_pinned()
        torch.testing.assert_close(back.cuda(), d)
    s.close()
