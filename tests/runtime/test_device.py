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
    b.wait(ev)
    ev.synchronize()
    assert ev.query() and a.query()
    assert isinstance(a.torch, torch.cuda.ExternalStream) and a.torch.cuda_stream == a.ptr
    assert a.__cuda_stream__() == (0, a.ptr) == a.torch.__cuda_stream__()
    ev.close()
    a.close()
    b.close()


def test_stream_context_sets_and_restores_torchs_current_stream(dev) -> None:
    import threading

    a, b = dev.create_stream(), dev.create_stream()
    outer = torch.cuda.current_stream()
    with a.context():
        assert torch.cuda.current_stream().cuda_stream == a.ptr
        with b.context():  # nested
            assert torch.cuda.current_stream().cuda_stream == b.ptr
            seen = []
            # Another thread's current stream is its own (torch keeps it per thread).
            t = threading.Thread(target=lambda: seen.append(torch.cuda.current_stream()))
            t.start()
            t.join()
            assert seen[0].cuda_stream != b.ptr
        assert torch.cuda.current_stream().cuda_stream == a.ptr
        x = torch.ones(4, device="cuda") * 3  # issued on a
        a.synchronize()
        assert x.sum().item() == 12
    assert torch.cuda.current_stream() == outer
    try:
        with a.context():
            raise KeyError("inside")
    except KeyError:
        pass
    assert torch.cuda.current_stream() == outer  # restored on the way out of an error
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
        s.copy(device, host)
        d = device.torch(torch.float32, (32, 32))
        assert d.is_cuda and d.data_ptr() == device.ptr
        with s.context():
            d.mul_(2.0)
        back = host.torch(torch.float32, (32, 32))
        s.copy(host, d)  # a tensor side works too
        s.synchronize()
        np.testing.assert_array_equal(back.numpy().ravel(), src)  # aliasing: same memory
        assert back.is_pinned()
        torch.testing.assert_close(back.cuda(), d)
    s.close()


def test_copy_checks_sizes_and_keeps_the_raw_form(dev) -> None:
    s = dev.create_stream()
    with dev.alloc_pinned(64) as host, dev.alloc_device(32) as small:
        host.numpy(np.int32)[:] = np.arange(16)
        with pytest.raises(ValueError, match="64-byte source to a 32-byte destination"):
            s.copy(small, host)
        s.copy(small, host, nbytes=32)
        s.copy_ptr_async(host.ptr + 32, small.ptr, 32)
        s.synchronize()
        assert host.numpy(np.int32).tolist() == list(range(8)) * 2
    s.close()


def test_2d_copy_moves_rows_between_pitches(dev) -> None:
    s = dev.create_stream()
    with dev.alloc_pinned(96) as host, dev.alloc_device(96) as device:
        src = host.numpy(np.int32).reshape(4, 6)
        src[:] = np.arange(24).reshape(4, 6)
        device.torch(torch.int32).fill_(-1)
        s.copy_2d_ptr_async(device.ptr, 32, host.ptr, 24, 12, 3)  # 3 x 3 ints into pitch 32
        s.synchronize()
        got = device.torch(torch.int32)[:24].view(3, 8).cpu().numpy()
        want = np.full((3, 8), -1, dtype=np.int32)
        want[:, :3] = src[:3, :3]
        np.testing.assert_array_equal(got, want)
    s.close()


def test_streams_events_and_buffers_live_on_the_device_they_name() -> None:
    from cuda.bindings import runtime as rt

    from cadence.runtime import DeviceBuffer, Event, Stream

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    rt.cudaSetDevice(0)
    s, ev, buf = Stream(device_index=1), Event(device_index=1), DeviceBuffer(64, device_index=1)
    assert rt.cudaGetDevice()[1] == 0  # the caller's device is left as it was
    assert rt.cudaStreamGetDevice(s.handle)[1] == 1
    attrs = rt.cudaPointerGetAttributes(buf.ptr)[1]
    assert attrs.device == 1
    ev.record(s)
    ev.synchronize()
    for r in (buf, ev, s):
        r.close()
