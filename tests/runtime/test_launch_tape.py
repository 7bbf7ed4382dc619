"""Launch tapes: what a recording pass collects or refuses, and a replay's launches (stand-in
kernels and a recording driver on the CPU; Triton kernels on a GPU)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from cadence.runtime import launcher
from cadence.runtime.kernel_params import triton_params
from cadence.runtime.launch_tape import LaunchTape, TapeRecorder, active_recorder, recording
from cadence.runtime.triton_launch import PreparedLaunch, TritonLaunch, record_launch
from tests.runtime.test_launcher import _bound, _bound_c, _CLaunch, _Driver, _Runtime, _Stream


class _Kernel:
    """A bound kernel stand-in: ``launch`` appends its name; ``c_call`` a C call that does."""

    def __init__(self, name: str, log: list[str], errors: list[int] | None = None,
                 c_entry: bool = True) -> None:
        self.name, self.log, self.errors, self.c_entry = name, log, errors or [], c_entry
        self.streams: list[Any] = []

    def launch(self, stream: Any) -> None:
        self.streams.append(stream)
        self.log.append(f"{self.name}@checked")

    def c_call(self, stream: Any) -> Any:
        if not self.c_entry:
            return None

        def call() -> int:
            self.log.append(self.name)
            return self.errors.pop(0) if self.errors else 0

        return call


def test_the_recorder_is_seen_only_inside_its_context_and_thread() -> None:
    assert active_recorder() is None
    seen: list[Any] = []
    with recording() as outer:
        assert active_recorder() is outer
        with recording() as inner:
            assert active_recorder() is inner
        assert active_recorder() is outer
        thread = threading.Thread(target=lambda: seen.append(active_recorder()))
        thread.start()
        thread.join()
    assert active_recorder() is None and seen == [None]


def test_a_replay_launches_in_recorded_order_on_the_recorded_stream() -> None:
    log: list[str] = []
    a, b, c = _Kernel("a", log), _Kernel("b", log, c_entry=False), _Kernel("c", log)
    recorder = TapeRecorder()
    for kernel in (a, b, c, a):
        recorder.add(kernel, 0x55)
    tape = LaunchTape(recorder)
    assert len(tape) == 4 and tape.stream == 0x55 and log == []
    tape.replay()
    tape.replay()
    assert log == ["a", "b@checked", "c", "a"] * 2
    assert b.streams == [0x55, 0x55]


def test_a_failed_c_call_goes_through_the_checked_launch() -> None:
    log: list[str] = []
    recorder = TapeRecorder()
    recorder.add(_Kernel("a", log, errors=[201]), 7)
    recorder.add(_Kernel("b", log), 7)
    LaunchTape(recorder).replay()
    assert log == ["a", "a@checked", "b"]


def test_a_refused_recording_keeps_its_first_reason_and_makes_no_tape() -> None:
    log: list[str] = []
    recorder = TapeRecorder()
    recorder.add(_Kernel("a", log), 1)
    assert recorder.refused is None
    recorder.add(_Kernel("b", log), 2)
    assert recorder.refused is not None and "two streams" in recorder.refused
    recorder.refuse("later")
    assert "two streams" in recorder.refused
    with pytest.raises(ValueError, match="two streams"):
        LaunchTape(recorder)


def test_a_bound_kernel_launched_while_recording_refuses_the_recording(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drv, rt = _Driver(), _Runtime()
    kernel, _ = _bound(monkeypatch, drv, rt)
    with recording() as recorder:
        kernel.launch(_Stream(3))
    assert len(drv.calls) == 1  # it still ran
    assert recorder.refused is not None and "BoundKernel" in recorder.refused
    kernel.launch(_Stream(3))  # no recorder: nothing to refuse


def test_c_call_is_the_launch_as_one_c_call(monkeypatch: pytest.MonkeyPatch) -> None:
    c_launch, drv, rt = _CLaunch(), _Driver(), _Runtime()
    kernel, params = _bound_c(monkeypatch, c_launch, drv, rt)
    call = kernel.c_call(_Stream(0x77))
    assert call() == 0 and call() == 0
    assert c_launch.calls == [(0xF00, 4, 2, 1, 128, 1, 1, 256, 0x77, params.address, None)] * 2
    empty, _ = _bound_c(monkeypatch, c_launch, drv, rt)
    empty._empty = True
    assert empty.c_call(0) is None
    plain, _ = _bound(monkeypatch, _Driver(), rt)  # a recording driver: no C entry point
    assert plain.c_call(0) is None


def _compiled(**metadata: Any) -> Any:
    md = dict(num_ctas=1, num_warps=4, shared=512, name="axpy", global_scratch_size=0,
              profile_scratch_size=0)
    md.update(metadata)
    signature = {"x": "*fp32", "n": "i32", "a": "fp32", "BLOCK": "constexpr"}
    return SimpleNamespace(metadata=SimpleNamespace(**md), function=0xABC,
                           src=SimpleNamespace(signature=signature))


class _Ptr:
    dtype = "fp32"

    def __init__(self, ptr: int) -> None:
        self.ptr_value = ptr

    def data_ptr(self) -> int:
        return self.ptr_value


def test_a_triton_launch_is_bound_to_its_packed_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "cudriver", lambda: _Driver())
    monkeypatch.setattr(launcher, "cudart", lambda: _Runtime())
    compiled, x = _compiled(), _Ptr(0x1000)
    recorder = TapeRecorder()
    record_launch(recorder, compiled, (3, 2, 1), 0x9, 0, (x, 77, 1.5, 256))
    assert recorder.refused is None and recorder.stream == 0x9
    (kernel,) = recorder.launches
    assert kernel.grid == (3, 2, 1) and kernel.block == (128, 1, 1) and kernel.shared_mem == 512
    expected = triton_params(["*fp32", "i32", "fp32", "constexpr"], [x, 77, 1.5, 256], 2)
    assert kernel.params.as_bytes() == [bytes(v) for v in expected]
    assert recorder.values == [(x, 77, 1.5, 256)]
    assert x not in kernel._keepalive  # the tape's owner decides what stays alive

    pdl = TapeRecorder()  # a PDL kernel is taped as a plain launch
    record_launch(pdl, _compiled(launch_pdl=True), (1, 1, 1), 0x9, 0, (x, 1, 1.0, 256))
    assert pdl.refused is None and len(pdl.launches) == 1
    refused = TapeRecorder()
    record_launch(refused, _compiled(num_ctas=2), (1, 1, 1), 0x9, 0, (x, 1, 1.0, 256))
    assert refused.launches == [] and "clusters" in (refused.refused or "")
    short = TapeRecorder()  # fewer values than parameters (a constexpr left to its default)
    record_launch(short, compiled, (1, 1, 1), 0x9, 0, (x, 1, 1.0))
    assert short.launches == [] and short.refused is not None


def test_prepared_launches_record_themselves_and_tritons_own_path_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cadence.runtime import triton_launch

    calls: list[tuple[Any, ...]] = []
    compiled = _compiled()
    prepared = PreparedLaunch(lambda *a: calls.append(a), 0xABC, "meta", False, False, (256,),
                              lambda device: 0x40 + device, compiled)
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(triton_launch, "record_launch", lambda *args: seen.append(args))

    prepared(4, 1, 1, 2, (_Ptr(8), 5, 0.5))
    assert len(calls) == 1 and calls[0][3] == 0x42 and seen == []
    with recording() as recorder:
        prepared(4, 1, 1, 2, (x := _Ptr(8), 5, 0.5))
    assert seen == [(recorder, compiled, (4, 1, 1), 0x42, 2, (x, 5, 0.5, 256))]

    class Kernel:  # Triton's own path: kernel[grid](...), nothing the launcher can bind
        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **kwargs: calls.append(("triton", grid)) or object()

    launch = TritonLaunch(Kernel())
    with recording() as rec:
        launch((2,), (_Ptr(16), 3), BLOCK=64)
    assert calls[-1] == ("triton", (2,)) and "through Triton" in (rec.refused or "")


@pytest.mark.gpu
def test_a_replayed_tape_computes_from_its_buffers_current_contents() -> None:
    import torch

    from tests.runtime.test_triton_launch import _kernel

    axpy = TritonLaunch(_kernel())
    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    mid, out = torch.empty_like(x), torch.empty_like(x)

    def step() -> None:
        axpy((4,), (x, y, mid, 2.0, 1000), BLOCK=256)
        axpy((4,), (mid, x, out, -1.0, 1000), BLOCK=256)

    step()  # compiles
    with recording() as recorder:
        step()
    assert recorder.refused is None and len(recorder.launches) == 2
    tape = LaunchTape(recorder)
    for _ in range(3):
        x.copy_(torch.randn(1000, device="cuda"))
        y.copy_(torch.randn(1000, device="cuda"))
        out.zero_()
        tape.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, -(2.0 * x + y) + x)
