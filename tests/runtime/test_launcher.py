"""The kernel launcher: parameter layouts and the launch call (a recording driver on CPU), and
real Numba, Triton and NVRTC kernels on a GPU."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

from cadence.runtime import launcher
from cadence.runtime.kernel_params import (
    LaunchUnsupported,
    PackedParams,
    numba_params,
    raw_params,
    triton_params,
)


def _words(values: list[Any]) -> list[int]:
    """Each parameter's bytes as a little-endian integer."""
    return [int.from_bytes(bytes(v), "little", signed=False) for v in values]


def test_packed_params_point_at_their_values() -> None:
    values = [ctypes.c_int32(7), ctypes.c_double(2.5), ctypes.c_void_p(0x1234)]
    packed = PackedParams(values)
    array = (ctypes.c_void_p * 3).from_address(packed.address)
    assert [array[i] for i in range(3)] == [ctypes.addressof(v) for v in values]
    assert ctypes.c_int32.from_address(array[0]).value == 7
    assert len(packed) == 3 and PackedParams([]).address == 0


def test_numba_array_and_scalar_layout() -> None:
    from numba import typeof
    from numba.core import types as nbt

    a = np.zeros((3, 4), dtype=np.float32)
    col = np.zeros((4, 3), dtype=np.int64).T  # strided (non-contiguous)
    params = numba_params((typeof(a), typeof(col), nbt.int32, nbt.float64, nbt.boolean),
                          (a, col, -5, 0.5, True))
    assert len(params) == (5 + 4) * 2 + 3
    words = _words(params)
    # meminfo, parent, nitems, itemsize, data, shape..., strides...
    assert words[:9] == [0, 0, 12, 4, a.ctypes.data, 3, 4, 16, 4]
    assert words[9:18] == [0, 0, 12, 8, col.ctypes.data, 3, 4, 8, 24]
    assert params[18].value == -5 and isinstance(params[18], ctypes.c_int32)
    assert params[19].value == 0.5 and params[20].value is True
    with pytest.raises(LaunchUnsupported):
        numba_params((typeof(a),), (np.zeros(3, np.float32),))  # ndim differs from its type
    with pytest.raises(LaunchUnsupported):
        numba_params((nbt.unicode_type,), ("x",))


class _Tensor:
    def __init__(self, ptr: int) -> None:
        self._ptr = ptr

    def data_ptr(self) -> int:
        return self._ptr


def test_triton_layout_skips_constexprs_and_appends_scratch() -> None:
    sig = ["*fp32", "i32", "constexpr", "fp32", "*i64", "bf16", "constexpr"]
    params = triton_params(sig, [_Tensor(0x1000), 9, 1, 1.5, None, 1.0, 64], scratch=2)
    assert len(params) == 5 + 2
    assert params[0].value == 0x1000 and params[1].value == 9
    assert isinstance(params[2], ctypes.c_float) and params[2].value == 1.5
    assert params[3].value is None  # a None pointer is NULL
    assert params[4].value == 0x3F80  # bfloat16 1.0
    assert [p.value for p in params[5:]] == [None, None]
    with pytest.raises(LaunchUnsupported):
        triton_params(["tensordesc<fp16[64, 64]>"], [None], 0)


def test_raw_params_need_c_types_for_scalars() -> None:
    class Buffer:
        ptr, nbytes = 0xABC, 16

    params = raw_params([Buffer(), ctypes.c_int32(3)])
    assert params[0].value == 0xABC and params[1].value == 3
    with pytest.raises(LaunchUnsupported, match="ctypes.c_int32"):
        raw_params([3])


class _Driver:
    """cuLaunchKernel and the handle types, recording each launch."""

    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_INVALID_CONTEXT = 201

    def __init__(self, errors: list[int] | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.errors = errors or []
        self.CUfunction = lambda h: ("fn", h)  # noqa: N803 (cuda-python's names)
        self.CUstream = lambda h: ("stream", h)  # noqa: N803

    def cuLaunchKernel(self, *args: Any) -> tuple[int]:  # noqa: N802
        self.calls.append(args)
        return (self.errors.pop(0) if self.errors else 0,)

    def cuLaunchCooperativeKernel(self, *args: Any) -> tuple[int]:  # noqa: N802
        self.calls.append(("cooperative", *args))
        return (self.errors.pop(0) if self.errors else 0,)


class _Runtime:
    def __init__(self) -> None:
        self.set_device: list[int] = []

    def cudaSetDevice(self, index: int) -> tuple[int]:  # noqa: N802
        self.set_device.append(index)
        return (0,)


class _Stream:
    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.handle


def _bound(monkeypatch: pytest.MonkeyPatch, drv: _Driver, rt: _Runtime, grid: Any = (4, 2)) -> Any:
    monkeypatch.setattr(launcher, "cudriver", lambda: drv)
    monkeypatch.setattr(launcher, "cudart", lambda: rt)
    params = PackedParams([ctypes.c_int32(1)])
    return launcher.BoundKernel(0xF00, grid, 128, params, shared_mem=256, device_index=1), params


def test_launch_is_one_driver_call_on_the_protocol_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    drv, rt = _Driver(), _Runtime()
    kernel, params = _bound(monkeypatch, drv, rt)
    s = _Stream(0x77)
    kernel.launch(s)
    kernel(s)
    kernel.launch(0x99)
    kernel.launch(None)
    kernel.launch(None)
    assert drv.calls == [
        (("fn", 0xF00), 4, 2, 1, 128, 1, 1, 256, ("stream", h), params.address, 0)
        for h in (0x77, 0x77, 0x99, 0, 0)
    ]
    assert list(kernel._streams) == [s, 0x99, None]  # each stream converted once
    with pytest.raises(TypeError, match="__cuda_stream__"):
        kernel.launch(object())
    assert rt.set_device == []


class _FirstParamDriver(_Driver):
    """Records, at each launch, the value of the kernel's first parameter (a uint64)."""

    def __init__(self) -> None:
        super().__init__()
        self.first: list[int] = []

    def cuLaunchKernel(self, *args: Any) -> tuple[int]:  # noqa: N802
        param = ctypes.c_void_p.from_address(args[9]).value
        self.first.append(ctypes.c_uint64.from_address(param).value)
        return super().cuLaunchKernel(*args)


def test_launch_blocks_sets_the_grid_of_one_launch_and_scalars_pass_by_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drv, rt = _FirstParamDriver(), _Runtime()
    monkeypatch.setattr(launcher, "cudriver", lambda: drv)
    monkeypatch.setattr(launcher, "cudart", lambda: rt)
    n = ctypes.c_uint64(5)
    kernel = launcher.bind_function(0xF00, grid=1, block=512, args=(n,), device_index=0)
    kernel.launch_blocks(_Stream(3), 7)
    n.value = 9
    kernel.launch_blocks(_Stream(3), 2)
    kernel.launch_blocks(_Stream(3), 0)  # nothing to do: no launch
    kernel.launch(_Stream(3))
    assert [c[1:4] for c in drv.calls] == [(7, 1, 1), (2, 1, 1), (1, 1, 1)]
    assert drv.first == [5, 9, 9]


def test_launch_without_a_current_context_selects_the_device_and_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drv, rt = _Driver(errors=[201]), _Runtime()
    kernel, _ = _bound(monkeypatch, drv, rt)
    kernel.launch(_Stream(5))
    assert len(drv.calls) == 2 and rt.set_device == [1]


def test_a_failed_launch_raises_and_an_empty_grid_launches_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cadence.runtime import CudaError

    drv, rt = _Driver(errors=[1]), _Runtime()
    kernel, _ = _bound(monkeypatch, drv, rt)
    with pytest.raises(CudaError, match="cuLaunchKernel"):
        kernel.launch(_Stream(5))
    empty, _ = _bound(monkeypatch, _Driver(), rt, grid=(0, 1))
    empty.launch(_Stream(5))
    with pytest.raises(ValueError):
        launcher._dims((1, 2, 3, 4))
    assert launcher._dims(7) == (7, 1, 1)


class _CLaunch:
    """libcuda's cuLaunchKernel as the launcher calls it through ctypes: plain integers."""

    def __init__(self, errors: list[int] | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.errors = errors or []

    def __call__(self, *args: Any) -> int:
        self.calls.append(args)
        return self.errors.pop(0) if self.errors else 0


def _bound_c(monkeypatch: pytest.MonkeyPatch, c_launch: _CLaunch, drv: _Driver,
             rt: _Runtime) -> Any:
    drv.__name__ = "cuda.bindings.driver"  # as cuda-python's own module is named
    monkeypatch.setattr(launcher, "_libcuda_launch", lambda: c_launch)
    return _bound(monkeypatch, drv, rt)


def test_the_c_entry_point_takes_raw_handles_and_the_bindings_stay_unused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c_launch, drv, rt = _CLaunch(), _Driver(), _Runtime()
    kernel, params = _bound_c(monkeypatch, c_launch, drv, rt)
    s = _Stream(0x77)
    kernel.launch(s)
    kernel.launch(s)
    kernel.launch(None)
    kernel.launch_blocks(0x99, 3)
    assert c_launch.calls == [
        (0xF00, 4, 2, 1, 128, 1, 1, 256, 0x77, params.address, None),
        (0xF00, 4, 2, 1, 128, 1, 1, 256, 0x77, params.address, None),
        (0xF00, 4, 2, 1, 128, 1, 1, 256, 0, params.address, None),
        (0xF00, 3, 1, 1, 128, 1, 1, 256, 0x99, params.address, None),
    ]
    assert drv.calls == [] and list(kernel._handles) == [s, None, 0x99]


def test_the_c_entry_point_falls_back_without_a_context_and_raises_other_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cadence.runtime import CudaError

    # No current context: the bindings' path selects the device and launches again.
    c_launch, drv, rt = _CLaunch(errors=[201]), _Driver(errors=[201]), _Runtime()
    kernel, _ = _bound_c(monkeypatch, c_launch, drv, rt)
    kernel.launch(_Stream(5))
    assert len(c_launch.calls) == 1 and len(drv.calls) == 2 and rt.set_device == [1]
    other = _Driver()
    failing, _ = _bound_c(monkeypatch, _CLaunch(errors=[700]), other, rt)
    other.CUresult = lambda code: code  # the code, as cuda-python's enum would wrap it
    with pytest.raises(CudaError, match="cuLaunchKernel"):
        failing.launch(_Stream(5))


def test_a_recording_driver_never_meets_the_c_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    c_launch, drv, rt = _CLaunch(), _Driver(), _Runtime()
    monkeypatch.setattr(launcher, "_libcuda_launch", lambda: c_launch)
    kernel, _ = _bound(monkeypatch, drv, rt)
    kernel.launch(_Stream(5))
    assert c_launch.calls == [] and len(drv.calls) == 1


def test_a_cooperative_binding_launches_through_the_cooperative_entry_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bindings' cuLaunchCooperativeKernel, and libcuda's through ctypes (a launch tape's
    C call too): cuLaunchKernel's parameters less ``extra``; cuLaunchKernel is never called."""
    drv, rt = _Driver(), _Runtime()
    monkeypatch.setattr(launcher, "cudriver", lambda: drv)
    monkeypatch.setattr(launcher, "cudart", lambda: rt)
    params = PackedParams([ctypes.c_int32(1)])
    kernel = launcher.BoundKernel(0xF00, (132,), 256, params, device_index=0, cooperative=True)
    kernel.launch(_Stream(0x77))
    assert drv.calls == [("cooperative", ("fn", 0xF00), 132, 1, 1, 256, 1, 1, 0,
                          ("stream", 0x77), params.address)]
    c_launch, plain = _CLaunch(), _CLaunch()
    drv.__name__ = "cuda.bindings.driver"
    monkeypatch.setattr(launcher, "_libcuda_cooperative_launch", lambda: c_launch)
    monkeypatch.setattr(launcher, "_libcuda_launch", lambda: plain)
    kernel = launcher.BoundKernel(0xF00, (132,), 256, params, device_index=0, cooperative=True)
    kernel.launch(_Stream(0x77))
    kernel.c_call(0x99)()
    assert c_launch.calls == [(0xF00, 132, 1, 1, 256, 1, 1, 0, 0x77, params.address),
                              (0xF00, 132, 1, 1, 256, 1, 1, 0, 0x99, params.address)]
    assert plain.calls == [] and len(drv.calls) == 1


class _Compiled:
    """A compiled Triton kernel as bind_compiled_triton reads it: one i32 parameter."""

    class src:  # noqa: N801 (Triton's attribute)
        signature = {"n": "i32"}

    def __init__(self, **metadata: Any) -> None:
        base = dict(num_ctas=1, num_warps=8, shared=0, launch_pdl=False,
                    launch_cooperative_grid=False)
        self.metadata = type("Metadata", (), {**base, **metadata})()
        self.function = 0xBEE


def test_triton_kernels_compiled_for_cooperative_launches_bind_cooperatively(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drv, rt = _Driver(), _Runtime()
    monkeypatch.setattr(launcher, "cudriver", lambda: drv)
    monkeypatch.setattr(launcher, "cudart", lambda: rt)
    coop = launcher.bind_compiled_triton(_Compiled(launch_cooperative_grid=True), (132,), [7], 0)
    plain = launcher.bind_compiled_triton(_Compiled(), (132,), [7], 0)
    assert coop.cooperative and not plain.cooperative
    coop.launch(None)
    plain.launch(None)
    assert [c[0] for c in drv.calls] == ["cooperative", ("fn", 0xBEE)]
    # A kernel compiled for programmatic dependent launches binds to a plain launch (its
    # griddepcontrol waits then return at once); clusters still take Triton's path.
    pdl = launcher.bind_compiled_triton(_Compiled(launch_pdl=True), (132,), [7], 0)
    pdl.launch(None)
    assert not pdl.cooperative and drv.calls[-1][0] == ("fn", 0xBEE)
    with pytest.raises(LaunchUnsupported, match="clusters"):
        launcher.bind_compiled_triton(_Compiled(num_ctas=2), (132,), [7], 0)


def test_bind_refuses_a_kernel_without_a_block_size() -> None:
    with pytest.raises(ValueError, match="block size"):
        launcher.bind(0xF00, grid=1)


@pytest.mark.gpu
def test_numba_kernel_bound_once_matches_numba_and_is_capturable() -> None:
    import torch
    from numba import cuda

    from cadence.runtime import BoundKernel, bind, get_device

    @cuda.jit
    def axpy(out, x, a, n):
        i = cuda.grid(1)
        if i < n:
            out[i] = a * x[i] + out[i]

    dev = get_device("cuda")
    s = dev.create_stream()
    x = torch.arange(1000, dtype=torch.float32, device="cuda")
    out = torch.ones(1000, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    k = bind(axpy, grid=8, block=128, args=(out, x, np.float32(2.0), 1000))
    assert isinstance(k, BoundKernel)
    k.launch(s)
    s.synchronize()
    torch.testing.assert_close(out, 2 * x + 1)
    with s.capture() as g:
        k.launch(s)
    x.fill_(1.0)
    torch.cuda.synchronize()
    g.launch(s)
    s.synchronize()
    torch.testing.assert_close(out, 2 * torch.arange(1000.0, device="cuda") + 3)  # sees new x
    assert g.kernel_count == 1
    g.close()
    s.close()


@pytest.mark.gpu
def test_triton_kernel_bound_once_matches_triton() -> None:
    import torch
    import triton
    import triton.language as tl

    from cadence.runtime import bind, get_device

    @triton.jit
    def scale(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):  # noqa: N803
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * factor, mask=mask)

    dev = get_device("cuda")
    s = dev.create_stream()
    x = torch.randn(3000, device="cuda")
    out = torch.zeros_like(x)
    torch.cuda.synchronize()
    k = bind(scale, grid=(triton.cdiv(3000, 256),), args=(x, out, 3000, 0.5), BLOCK=256,
             num_warps=4)
    k.launch(s)
    s.synchronize()
    torch.testing.assert_close(out, x * 0.5)


@pytest.mark.gpu
def test_nvrtc_function_bound_and_launched() -> None:
    from cadence.runtime import Module, bind_function, get_device

    dev = get_device("cuda")
    s = dev.create_stream()
    src = r"""extern "C" __global__ void add(int *x, int n, int v) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += v; }"""
    with Module.from_source(src) as mod, dev.alloc_device(4000) as buf:
        host = dev.alloc_pinned(4000)
        host.numpy(np.int32)[:] = np.arange(1000)
        s.copy(buf, host)
        k = bind_function(mod.function("add"), grid=4, block=256,
                          args=(buf, ctypes.c_int32(1000), ctypes.c_int32(5)))
        k.launch(s)
        s.copy(host, buf)
        s.synchronize()
        assert host.numpy(np.int32).tolist() == list(range(5, 1005))
        host.close()
    s.close()
