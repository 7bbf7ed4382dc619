"""The CPU backend honours the runtime contract synchronously."""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from cadence.runtime import CpuDevice, cpu, get_device


def test_get_device_cpu() -> None:
    dev = get_device("cpu")
    assert isinstance(dev, CpuDevice)
    assert dev.torch_device == torch.device("cpu")
    free, total = dev.mem_get_info()
    assert 0 < free <= total
    with pytest.raises(ValueError):
        get_device("tpu")  # type: ignore[arg-type]


def test_events_are_complete_and_time_host_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # The host clock the events read, moved by hand: 12.5 ms pass between the two records.
    now = [100.0]
    monkeypatch.setattr(cpu, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    dev = CpuDevice()
    s = dev.create_stream(priority=-1)
    start, end = dev.create_event(timing=True), dev.create_event(timing=True)
    start.record(s)
    now[0] += 0.0125
    end.record(s)
    assert start.query() and end.query()
    assert start.elapsed_ms(end) == pytest.approx(12.5)
    assert end.elapsed_ms(start) == pytest.approx(-12.5)
    plain = s.record()
    assert plain.query() and not plain.timing
    with pytest.raises(ValueError):
        plain.elapsed_ms(end)
    other = dev.create_stream()
    s.wait(other)
    s.wait(plain)
    assert not hasattr(plain, "wait")  # one direction only: the stream waits
    with s.context():
        pass
    assert s.torch is None
    for r in (s, other, start, end, plain):
        r.close()


def test_buffers_copies_are_synchronous() -> None:
    dev = CpuDevice()
    with dev.alloc_pinned(64) as host, dev.alloc_device(64) as device:
        src = host.numpy(np.int64)
        src[:] = np.arange(8)
        stream = dev.create_stream()
        stream.copy(device, host)
        assert device.torch(torch.int64).tolist() == list(range(8))
        assert host.torch(torch.int32, (2, 8))[0, 2].item() == 1
        stream.copy_ptr_async(device.ptr, host.ptr + 8, 8)  # the raw form: no checks
        assert device.numpy(np.int64)[:2].tolist() == [1, 1]
        small = dev.alloc_device(16)
        with pytest.raises(ValueError, match="64-byte source to a 16-byte destination"):
            stream.copy(small, host)
        stream.copy(small, torch.tensor([5, 6], dtype=torch.int64))
        assert small.numpy(np.int64).tolist() == [5, 6]
        with pytest.raises(ValueError, match="contiguous"):
            stream.copy(small, torch.arange(4)[::2])
        with pytest.raises(TypeError, match="cannot copy"):
            stream.copy(small, [1, 2])
    with pytest.raises(ValueError, match="closed"):
        host.numpy()
    with pytest.raises(ValueError, match="closed"):
        stream.copy(small, host)


def test_2d_copy_moves_rows_between_pitches() -> None:
    dev = CpuDevice()
    stream = dev.create_stream()
    src = np.arange(24, dtype=np.int32).reshape(4, 6)  # pitch 24 bytes
    dst = np.full((3, 8), -1, dtype=np.int32)  # pitch 32 bytes
    stream.copy_2d_ptr_async(dst.ctypes.data, 32, src.ctypes.data, 24, 3 * 4, 3)
    want = np.full((3, 8), -1, dtype=np.int32)
    want[:, :3] = src[:3, :3]
    np.testing.assert_array_equal(dst, want)
    stream.copy_2d_ptr_async(dst.ctypes.data, 32, src.ctypes.data, 24, 0, 3)  # nothing
    stream.copy_2d_ptr_async(dst.ctypes.data, 32, src.ctypes.data, 24, 12, 0)
    np.testing.assert_array_equal(dst, want)


def test_capture_on_cpu_runs_the_block_once_and_cannot_replay() -> None:
    dev = CpuDevice()
    s = dev.create_stream()
    ran = []
    with s.capture() as graph:
        ran.append(1)
    assert ran == [1] and graph.kernel_count == 0 and graph.node_counts() == {}
    with pytest.raises(RuntimeError, match="cannot replay"):
        graph.launch(s)
    graph.close()


def test_runtime_imports_and_works_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['cuda'] = None;"
        "import numpy as np, cadence.runtime as rt;"
        "[getattr(rt, name) for name in rt.__all__];"
        "dev = rt.get_device('cpu'); s = dev.create_stream();"
        "h, d = dev.alloc_pinned(32), dev.alloc_device(32);"
        "h.numpy(np.int32)[:] = np.arange(8); s.copy(d, h); s.wait(s.record());"
        "assert d.numpy(np.int32).tolist() == list(range(8));"
        "assert dev.properties().warp_size == 1 and dev.stream_priority_range() == (0, 0);"
        "assert 'torch' not in sys.modules or sys.modules['torch'] is None"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_cpu_backend_works_without_cuda_python() -> None:
    # sys.modules[name] = None makes any import of that name fail, as on a CPU-only install.
    code = (
        "import sys; sys.modules['cuda'] = None; sys.modules['cupy'] = None;"
        "import torch, cadence.runtime, cadence.numba_kernels, cadence.graphs;"
        "assert 'numba.cuda' not in sys.modules;"
        "dev = cadence.runtime.get_device('cpu');"
        "pool = dev.create_slot_pool(2, 4); pool.release(pool.borrow()); pool.close()"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_cpu_backend_reports_the_host_as_its_device() -> None:
    import os

    from cadence.runtime import DeviceProperties, get_device

    dev = get_device("cpu")
    props = dev.properties()
    assert isinstance(props, DeviceProperties)
    assert props.multiprocessor_count == len(os.sched_getaffinity(0))
    assert props.total_memory == dev.mem_get_info()[1] > 0
    assert props.compute_capability == (0, 0) and props.warp_size == 1
    least, greatest = dev.stream_priority_range()
    assert least == greatest == 0
    dev.create_stream(priority=greatest).synchronize()


def test_no_cuda_device_is_said_plainly() -> None:
    import enum

    import pytest

    from cadence.runtime import NoCudaDeviceError
    from cadence.runtime.device import _device_count
    from cadence.runtime.errors import CudaError

    class Status(enum.IntEnum):
        cudaSuccess = 0
        cudaErrorInsufficientDriver = 35
        cudaErrorNoDevice = 100
        cudaErrorInitializationError = 3

    class FakeRuntime:
        def __init__(self, status: Status, count: int) -> None:
            self.result = (status, count)

        def cudaGetDeviceCount(self):  # noqa: N802 (cudart's name)
            return self.result

    assert _device_count(FakeRuntime(Status.cudaSuccess, 2)) == 2
    for status, count in ((Status.cudaErrorInsufficientDriver, 0),
                          (Status.cudaErrorNoDevice, 0), (Status.cudaSuccess, 0)):
        with pytest.raises(NoCudaDeviceError, match="there is no CUDA device"):
            _device_count(FakeRuntime(status, count))
    with pytest.raises(CudaError, match="cudaErrorInitializationError"):  # a real failure
        _device_count(FakeRuntime(Status.cudaErrorInitializationError, 0))


def test_the_cpu_backend_has_every_public_member_of_the_cuda_one() -> None:
    from cadence.runtime import buffers, device, event, graph, stream

    # What only a CUDA object can have: its protocol, raw handles' owners, and the interop.
    cuda_only = {"__cuda_stream__", "__cuda_array_interface__", "flags", "device_index"}
    pairs = [
        (device.Device, cpu.CpuDevice), (stream.Stream, cpu.CpuStream),
        (event.Event, cpu.CpuEvent), (graph.Graph, cpu.CpuGraph),
        (buffers.DeviceBuffer, cpu.CpuBuffer), (buffers.PinnedBuffer, cpu.CpuBuffer),
    ]
    for cuda_cls, cpu_cls in pairs:
        wanted = {n for n in vars(cuda_cls) if not n.startswith("_") or n.startswith("__cuda")}
        missing = sorted(n for n in wanted - cuda_only if not hasattr(cpu_cls, n))
        assert not missing, f"{cpu_cls.__name__} lacks {missing} of {cuda_cls.__name__}"


def test_cuda_errors_survive_pickling() -> None:
    """Tensor-parallel ranks send their errors to the engine pickled: a CudaError must come
    back as itself."""
    import pickle

    from cadence.runtime.errors import CudaError

    err = CudaError("cudaMalloc", 2, "cudaErrorMemoryAllocation", "out of memory")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is CudaError and str(back) == str(err)
    assert (back.call, back.code, back.name) == ("cudaMalloc", 2, "cudaErrorMemoryAllocation")


def test_stream_records_the_event_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [5.0]
    monkeypatch.setattr(cpu, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    dev = CpuDevice()
    s = dev.create_stream(priority=-1)
    assert s.priority == -1 and dev.create_stream().priority is None  # as the CUDA stream keeps it
    start, end = dev.create_event(timing=True), dev.create_event(timing=True)
    assert s.record(start) is start
    now[0] += 0.002
    assert s.record(end) is end
    assert start.elapsed_ms(end) == pytest.approx(2.0)


@pytest.mark.parametrize("nbytes", [0, -8])
def test_empty_buffers_are_refused_like_cuda_ones(nbytes: int) -> None:
    dev = CpuDevice()
    for alloc in (dev.alloc_pinned, dev.alloc_device):
        with pytest.raises(ValueError, match=f"nbytes must be at least 1, got {nbytes}"):
            alloc(nbytes)
