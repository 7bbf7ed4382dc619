"""TritonLaunch: the first launch of a specialization goes through Triton, later ones straight
to the compiled launcher, with the same results; a change of dtype, alignment or integer class
compiles a new specialization instead of reusing a wrong one."""

from __future__ import annotations

import pytest
import torch

from cadence.runtime.triton_launch import _key, _spec


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def axpy(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, a * x + y, mask=mask)

    return axpy


@pytest.mark.gpu
def test_fast_launches_match_triton():
    from cadence.runtime.triton_launch import TritonLaunch

    launch = TritonLaunch(_kernel())
    for step in range(4):
        n = 1000 + step * 64  # same integer classes: one specialization
        x = torch.randn(n, device="cuda")
        y = torch.randn(n, device="cuda")
        out = torch.empty_like(x)
        launch(((n + 255) // 256,), (x, y, out, 2.5, n), BLOCK=256)
        torch.testing.assert_close(out, 2.5 * x + y)
    assert launch.fast_launches == 3
    # A misaligned view and a bfloat16 input each take a new specialization, still right.
    x = torch.randn(1025, device="cuda")[1:]
    y = torch.randn(1024, device="cuda")
    out = torch.empty_like(y)
    launch((4,), (x, y, out, -1.0, 1024), BLOCK=256)
    torch.testing.assert_close(out, -x + y)
    xb, yb = x.bfloat16(), y.bfloat16()
    outb = torch.empty_like(yb)
    launch((4,), (xb, yb, outb, 0.5, 1024), BLOCK=256)
    torch.testing.assert_close(outb, (0.5 * xb.float() + yb.float()).bfloat16(), atol=2e-2,
                               rtol=2e-2)
    assert launch.fast_launches == 3


@pytest.mark.gpu
def test_launch_inside_a_cuda_graph():
    from cadence.runtime.triton_launch import TritonLaunch

    launch = TritonLaunch(_kernel())
    x = torch.randn(512, device="cuda")
    y = torch.randn(512, device="cuda")
    out = torch.empty_like(x)
    launch((2,), (x, y, out, 1.0, 512), BLOCK=256)  # compiles
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        launch((2,), (x, y, out, 3.0, 512), BLOCK=256)
    x.copy_(torch.randn(512, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, 3.0 * x + y)


def test_spec_classes():
    t = torch.zeros(8)
    assert _spec(t) == (torch.float32, True)
    assert _spec(t[1:]) == (torch.float32, False)
    assert _spec(1) == (True, False, True) and _spec(32) == (False, True, True)
    assert _spec(7) == (False, False, True)
    # Triton types an int i32 or i64 by its value: a stride past int32 is another kernel.
    assert _spec(2**31 - 16) == (False, True, True) and _spec(2**31) == (False, True, False)
    assert _spec(-(2**31)) == (False, True, True) and _spec(-(2**31) - 16)[2] is False
    assert _spec(0.5) is float and _spec(True) is bool
    mixed = (t, t[1:], 1, 32, 7, 0, 0.5, True, None, t.double())
    assert _key(mixed) == tuple(map(_spec, mixed))


def test_next_pow2() -> None:
    from cadence.runtime.triton_launch import next_pow2

    assert [next_pow2(n) for n in (0, 1, 2, 3, 4, 5, 128, 129)] == [1, 1, 2, 4, 4, 8, 128, 256]
    assert next_pow2(3, 16) == 16 and next_pow2(40, 16) == 64


class _RecordingKernel:
    """A stand-in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` records its keywords."""

    def __init__(self) -> None:
        self.launches: list[dict] = []

    def __getitem__(self, grid):  # type: ignore[no-untyped-def]
        def run(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.launches.append(kwargs)

        return run


def test_cooperative_launches_ask_triton_for_a_cooperative_grid() -> None:
    from cadence.runtime.triton_launch import TritonLaunch

    coop, plain = _RecordingKernel(), _RecordingKernel()
    TritonLaunch(coop, cooperative=True)((4,), (torch.zeros(4), 3), num_warps=8, BLOCK=16)
    TritonLaunch(plain)((4,), (torch.zeros(4), 3), num_warps=8, BLOCK=16)
    assert coop.launches[0]["launch_cooperative_grid"] is True
    assert coop.launches[0]["num_warps"] == 8 and coop.launches[0]["BLOCK"] == 16
    assert "launch_cooperative_grid" not in plain.launches[0]


def test_pdl_launches_ask_triton_for_one_and_key_apart() -> None:
    from cadence.runtime.triton_launch import TritonLaunch

    kernel = _RecordingKernel()
    launch = TritonLaunch(kernel, cooperative=True)
    args = (torch.zeros(4), 3)
    launch((4,), args, pdl=True, BLOCK=16)
    launch((4,), args, BLOCK=16)  # another specialization: Triton's path again, no PDL
    assert kernel.launches[0]["launch_pdl"] is True
    assert kernel.launches[0]["launch_cooperative_grid"] is True
    assert "launch_pdl" not in kernel.launches[1]
    assert "pdl" not in kernel.launches[0]  # an option of the launch, not a kernel argument
    assert "PDL" not in kernel.launches[0]  # the kernel has no such constexpr


def test_a_kernels_pdl_constexpr_follows_the_launch() -> None:
    """A kernel with a ``PDL`` constexpr gets the launch's ``pdl``: its waits are compiled in
    exactly where the launch lets it start early (never one without the other)."""
    from cadence.runtime.triton_launch import TritonLaunch

    kernel = _RecordingKernel()
    kernel.arg_names = ["x", "n", "BLOCK", "PDL"]
    launch = TritonLaunch(kernel)
    args = (torch.zeros(4), 3)
    launch((4,), args, pdl=True, BLOCK=16)
    launch((4,), args, BLOCK=16, PDL=True)  # a caller's own PDL gives way to the launch's
    assert kernel.launches[0]["PDL"] is True and kernel.launches[0]["launch_pdl"] is True
    assert kernel.launches[1]["PDL"] is False and "launch_pdl" not in kernel.launches[1]
    assert launch.prepared(args, pdl=True, BLOCK=16) is None  # a stand-in binds nothing


def test_pdl_is_off_on_the_cpu_and_under_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from cadence.runtime import triton_launch

    assert not triton_launch.pdl_enabled(torch.device("cpu"))
    monkeypatch.setattr(triton_launch, "_PDL", {})
    monkeypatch.setenv("CADENCE_DISABLE_PDL", "1")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    assert not triton_launch.pdl_enabled(torch.device("cuda", 0))
    monkeypatch.setattr(triton_launch, "_PDL", {})
    monkeypatch.delenv("CADENCE_DISABLE_PDL")
    assert triton_launch.pdl_enabled(torch.device("cuda", 0)) is (
        not triton_launch._INTERPRETED)
    monkeypatch.setattr(triton_launch, "_PDL", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (8, 0))
    assert not triton_launch.pdl_enabled(torch.device("cuda", 0))
