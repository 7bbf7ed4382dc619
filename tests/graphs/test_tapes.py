"""TapedSteps: per key, a pass as it is, then a recorded one, then replays; refusals of torch
ops and of passes without launches; which buffers a tape keeps alive. Stand-in kernels on the
CPU; the engine's eager decode steps on a GPU (tapes == graphs, token for token)."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest
import torch

from cadence.graphs.tapes import RECORD_ATTEMPTS, TapedSteps
from cadence.runtime.launch_tape import active_recorder


class _Kernel:
    """Runs ``effect`` when launched; records itself when a recording is on (as a prepared
    Triton launch does)."""

    def __init__(self, effect: Any) -> None:
        self.effect = effect
        self.launches = 0

    def __call__(self) -> None:
        self.launch(0)
        recorder = active_recorder()
        if recorder is not None:
            recorder.add(self, 0)

    def launch(self, stream: Any) -> None:
        self.launches += 1
        self.effect()


class _Step:
    """A pass: ``out = 2 * x`` through a stand-in kernel into an allocated output."""

    def __init__(self, x: torch.Tensor, torch_op: bool = False) -> None:
        self.x, self.torch_op = x, torch_op
        self.calls, self.recorded = 0, []
        self.out: torch.Tensor | None = None
        # Through numpy: the stand-in kernel's work is no torch op the guard would see.
        self.kernel = _Kernel(lambda: np.multiply(self.x.numpy(), 2, out=self.out.numpy()))

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        self.recorded.append(active_recorder() is not None)
        self.out = torch.empty_like(self.x).view(-1)[: self.x.numel()].view(self.x.shape)
        if self.torch_op:
            self.out.add_(0)
        self.kernel()
        return self.out


def test_first_pass_as_is_then_recorded_then_replayed() -> None:
    tapes = TapedSteps(torch.device("cpu"))
    x = torch.arange(4.0)
    step = _Step(x)
    outs = [tapes.run(1, step) for _ in range(2)]
    assert step.recorded == [False, True] and len(tapes) == 1 and tapes.tape(1) is not None
    assert len(tapes.tape(1)) == 1
    x.copy_(torch.tensor([5.0, 6.0, 7.0, 8.0]))
    out = tapes.run(1, step)
    assert step.calls == 2 and step.kernel.launches == 3 and tapes.replays == 1
    assert out is outs[1] and torch.equal(out, x * 2)  # the recorded output, rewritten
    assert tapes.run(2, _Step(x)) is not None and len(tapes) == 1  # another key starts over


def test_a_torch_op_refuses_the_recording_until_the_key_gives_up() -> None:
    tapes = TapedSteps(torch.device("cpu"))
    step = _Step(torch.ones(3), torch_op=True)
    for _ in range(RECORD_ATTEMPTS + 3):
        assert tapes.wants("k") == (step.calls <= RECORD_ATTEMPTS)
        assert torch.equal(tapes.run("k", step), torch.full((3,), 2.0))
    assert len(tapes) == 0 and "aten.add_" in tapes.refused["k"]
    assert step.recorded == [False] + [True] * RECORD_ATTEMPTS + [False, False]


def test_a_pass_without_launches_is_no_tape() -> None:
    tapes = TapedSteps(torch.device("cpu"))
    for _ in range(3):
        tapes.run("k", lambda: torch.empty(2).view(1, 2))
    assert len(tapes) == 0 and "no kernel" in tapes.refused["k"]


def test_allocations_and_views_are_allowed_other_ops_are_named() -> None:
    tapes = TapedSteps(torch.device("cpu"))
    x = torch.ones(2, 3)
    kernel = _Kernel(lambda: None)

    def step() -> torch.Tensor:
        y = torch.empty((4, 3)).view(12)[:6].reshape(2, 3).t().unsqueeze(0)
        a, b = torch.empty_like(x).split([1, 1])
        kernel()
        return y, a, b

    for _ in range(3):
        tapes.run("ok", step)
    assert len(tapes) == 1 and tapes.replays == 1
    tapes.run("bad", lambda: x.clone())
    tapes.run("bad", lambda: x.clone())
    assert "clone" in tapes.refused["bad"]
    # Arithmetic on dtypes and sizes is no device work; a scalar read from a tensor is.
    dtypes = lambda: (torch.promote_types(torch.float16, torch.bfloat16), kernel())  # noqa: E731
    for _ in range(2):
        tapes.run("dtypes", dtypes)
    assert tapes.tape("dtypes") is not None
    tapes.run("item", lambda: (kernel(), x.sum().item()))
    tapes.run("item", lambda: (kernel(), x[0, 0].item()))
    assert "_local_scalar_dense" in tapes.refused["item"]


@pytest.mark.parametrize("copying", ["contiguous", "reshape", "flatten", "to", "double"])
def test_composites_that_copy_under_inference_mode_refuse_the_recording(copying: str) -> None:
    """The engine records under inference mode, where ``contiguous`` and friends reach the
    guard whole, marked as views: a copy among them is refused; a true view is not."""
    tapes = TapedSteps(torch.device("cpu"))
    x = torch.randn(4, 6)
    kernel = _Kernel(lambda: None)
    ops = {"contiguous": lambda: x.t().contiguous(), "reshape": lambda: x.t().reshape(24),
           "flatten": lambda: x.t().flatten(), "to": lambda: x.to(torch.float64),
           "double": lambda: x.double()}

    def views() -> Any:
        kernel()
        return x.contiguous(), x.reshape(24), x.flatten(), x.to(torch.float32), x.t()

    with torch.inference_mode():
        for _ in range(2):
            tapes.run("copy", lambda: (kernel(), ops[copying]()))
            tapes.run("views", views)
    assert "copied" in tapes.refused["copy"] and tapes.tape("copy") is None
    assert tapes.tape("views") is not None


def test_no_pool_for_the_tapes_turns_them_off() -> None:
    """Where no private pool can be made (here: a CUDA device in name only), steps run as
    they are and no key is recorded again."""
    if torch.cuda.is_available():
        pytest.skip("the pool exists on a GPU")
    tapes = TapedSteps(torch.device("cuda"))
    step = _Step(torch.ones(2))
    for _ in range(4):
        tapes.run("k", step)
    assert tapes.disabled is not None and not tapes.wants("k") and len(tapes) == 0
    assert step.calls == 4 and step.recorded == [False] * 4


def test_a_pool_that_fails_when_entered_turns_the_tapes_off(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    from contextlib import contextmanager

    @contextmanager
    def failing():  # as use_mem_pool under an allocator backend without private pools
        raise RuntimeError("no private pools here")
        yield

    tapes = TapedSteps(torch.device("cpu"))
    monkeypatch.setattr(tapes, "_allocations", failing)
    step = _Step(torch.ones(2))
    for _ in range(3):
        assert torch.equal(tapes.run("k", step), torch.full((2,), 2.0))
    assert "no private pools" in (tapes.disabled or "") and step.calls == 3


def test_a_tape_keeps_buffers_from_outside_the_pass_alive_but_not_its_own() -> None:
    from cadence.graphs.tapes import outside_buffers

    outside, inside = torch.ones(5), torch.empty(5)
    values = [(outside, inside, 3), (outside[1:], 0.5)]
    kept = outside_buffers(values, {inside.untyped_storage().data_ptr()})
    assert len(kept) == 2 and kept[0] is outside and kept[1] is values[1][0]


def test_without_a_pool_a_tape_keeps_every_buffer_its_launches_read() -> None:
    tapes = TapedSteps(torch.device("cpu"))  # the CPU has no pool to hold the pass's memory
    outside = torch.ones(5)
    kernel = _Kernel(lambda: None)
    made: list[torch.Tensor] = []

    def step() -> None:
        inside = torch.empty(5)
        made.append(inside)
        kernel()
        recorder = active_recorder()
        if recorder is not None:
            recorder.values.append((outside, inside, 3, 0.5))

    for _ in range(2):
        tapes.run("k", step)
    kept = tapes.tape("k")._keepalive
    assert any(t is outside for t in kept) and any(t is made[1] for t in kept)


@pytest.mark.parametrize("bias", [False, True])
def test_matrix_products_are_replayed_into_the_tensors_they_made(bias: bool) -> None:
    tapes = TapedSteps(torch.device("cpu"))
    x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    kernel = _Kernel(lambda: None)

    def step() -> torch.Tensor:
        y = torch.nn.functional.linear(x, w, b if bias else None)
        z = torch.mm(y, w[:, :5].t()) if not bias else torch.addmm(b, y, w[:, :5].t())
        kernel()
        return z

    with torch.inference_mode():  # the engine's mode: F.linear reaches the guard whole
        outs = [tapes.run("k", step) for _ in range(2)]
    tape = tapes.tape("k")
    assert tape is not None and len(tape) == 3 and not tapes.refused
    x.copy_(torch.randn(3, 8))
    with torch.inference_mode():
        out = tapes.run("k", step)
        assert out is outs[1] and tapes.replays == 1 and kernel.launches == 3
        torch.testing.assert_close(out, step(), rtol=0, atol=0)  # the same products, again


def test_the_split_k_product_goes_on_the_tape() -> None:
    # model/split_k.py's batched product with float32 outputs (aten.bmm.dtype) is a matrix
    # product the tape replays, not an op that refuses the recording. On the meta device: the
    # CPU has no kernel for it.
    from cadence.graphs.tapes import _TorchOpGuard
    from cadence.runtime.launch_tape import recording

    x = torch.empty(64, 2048, dtype=torch.bfloat16, device="meta")
    w = torch.empty(1024, 2048, dtype=torch.bfloat16, device="meta")
    with torch.inference_mode(), recording() as rec, _TorchOpGuard(rec):
        out = torch.bmm(x.view(64, 8, 256).transpose(0, 1), w.view(1024, 8, 256).permute(1, 2, 0),
                        out_dtype=torch.float32)
    assert rec.refused is None and len(rec.launches) == 1
    assert out.shape == (8, 64, 1024) and out.dtype == torch.float32
    assert rec.launches[0].op is torch.ops.aten.bmm.dtype_out


def test_at_most_max_tapes_and_close_forgets_them() -> None:
    tapes = TapedSteps(torch.device("cpu"), max_tapes=1)
    x = torch.ones(2)
    for key in ("a", "b"):
        step = _Step(x)
        for _ in range(3):
            tapes.run(key, step)
    assert len(tapes) == 1 and tapes.tape("a") is not None and tapes.tape("b") is None
    assert tapes.wants("a") and not tapes.wants("b")
    tapes.close()
    assert len(tapes) == 0
    gc.collect()


# --- GPU: the engine's eager decode steps -------------------------------------------------------


def _tokens(monkeypatch: pytest.MonkeyPatch, batch: int, *, eager: bool, tapes: bool,
            dtype: str = "bfloat16") -> tuple[list[list[int]], Any]:
    from cadence import LLM, SamplingParams
    from tests.engine.test_gpu_engine import _free, _prompts

    monkeypatch.setenv("CADENCE_DISABLE_LAUNCH_TAPES", "0" if tapes else "1")
    llm = LLM(model="tiny", dtype=dtype, enforce_eager=eager, max_num_seqs=32,
              num_gpu_blocks_override=1024, device="cuda")
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    outs = llm.generate(_prompts(batch, 600, seed=batch), params, use_tqdm=False)
    runner = llm.engine_core.runner
    stats = (None if runner.tapes is None else
             (len(runner.tapes), runner.tapes.replays, dict(runner.tapes.refused)))
    _free(llm)
    return [o.outputs[0].token_ids for o in outs], stats


def _graph_sizes_cover(batch: int) -> None:
    from cadence.graphs import capture_sizes

    assert batch in capture_sizes(32), "compare at a capture size (no padding)"


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 2, 8, 24])
def test_taped_eager_decode_equals_graphs_bf16(monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    """The tapes replay the graphs' kernels with the graphs' shapes (skinny GEMMs up to 16
    rows, cuBLAS products past them): the same bits, so the same greedy tokens even in
    bfloat16 (batch sizes that are capture sizes: no padding)."""
    _graph_sizes_cover(batch)
    graphs, _ = _tokens(monkeypatch, batch, eager=False, tapes=True)
    taped, stats = _tokens(monkeypatch, batch, eager=True, tapes=True)
    assert taped == graphs
    num_tapes, replays, refused = stats
    assert num_tapes >= 1 and replays >= 30, stats  # decode steps replayed, as batches shrink
    assert not refused, refused


@pytest.mark.gpu
def test_tapes_off_and_on_give_the_same_tokens_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    plain, stats = _tokens(monkeypatch, 3, eager=True, tapes=False, dtype="float32")
    assert stats is None
    taped, stats = _tokens(monkeypatch, 3, eager=True, tapes=True, dtype="float32")
    assert taped == plain
    num_tapes, replays, refused = stats
    assert num_tapes >= 1 and replays >= 30 and not refused, stats


def _axpy_step(x: torch.Tensor, w: torch.Tensor) -> Any:
    from cadence.runtime.triton_launch import TritonLaunch
    from tests.runtime.test_triton_launch import _kernel

    axpy = TritonLaunch(_kernel())

    def step() -> torch.Tensor:
        mid = torch.empty_like(x)
        axpy((4,), (x, x, mid, 2.0, x.numel()), BLOCK=256)  # mid = 3x
        prod = torch.mm(mid.view(-1, 8), w)
        out = torch.empty_like(prod)
        axpy((1,), (prod, prod, out, -1.0, prod.numel()), BLOCK=256)  # out = 0
        return out, prod

    return step


@pytest.mark.gpu
def test_a_replay_survives_other_allocations_and_refuses_another_stream() -> None:
    tapes = TapedSteps(torch.device("cuda"))
    x = torch.randn(1024, device="cuda")
    w = torch.randn(8, 16, device="cuda")
    step = _axpy_step(x, w)
    for _ in range(2):
        tapes.run("k", step)
    assert tapes.tape("k") is not None and len(tapes.tape("k")) == 3, tapes.refused
    torch.cuda.empty_cache()
    others = [torch.full((1 << 20,), 7.0, device="cuda") for _ in range(8)]  # reuse bait
    for _ in range(3):
        x.copy_(torch.randn(1024, device="cuda"))
        out, prod = tapes.run("k", step)
        torch.cuda.synchronize()
        torch.testing.assert_close(prod, torch.mm(3 * x.view(-1, 8), w))
        assert torch.count_nonzero(out) == 0
    assert tapes.replays == 3 and all(bool((t == 7.0).all()) for t in others)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        tapes.run("k", step)  # a matrix product would run on the side stream: as it is
    side.synchronize()
    assert tapes.replays == 3
    tapes.close()


def test_the_runner_tries_each_batch_size_then_uploads_as_before(monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """The model runner with tapes (forced on the CPU, where every decode pass holds torch ops
    and is refused): each batch size's first passes upload the graphs' full block-table width
    and are recorded (and refused) under the guard; once the key gives up its steps upload as
    without tapes; the tokens are those of a run without tapes."""
    from cadence import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5 + i, 9, 11 + 2 * i, 4]} for i in range(3)]
    plain = LLM(model="tiny", dtype="float32", enforce_eager=True)
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    plain.engine_core.shutdown()

    llm = LLM(model="tiny", dtype="float32", enforce_eager=True)
    runner = llm.engine_core.runner
    assert runner.tapes is None  # the CPU: no tapes unless forced
    runner.tapes = TapedSteps(torch.device("cpu"))
    widths: list[tuple[int, bool]] = []
    upload = runner.buffers.upload

    def spy(inp, padded_tokens=None, padded_rows=None):  # type: ignore[no-untyped-def]
        md = upload(inp, padded_tokens, padded_rows)
        if inp.max_query_len == 1:
            widths.append((inp.num_reqs, md.block_tables.shape[1] == runner.buffers.max_blocks))
        return md

    monkeypatch.setattr(runner.buffers, "upload", spy)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    tapes = runner.tapes
    assert len(tapes) == 0 and "torch op" in tapes.refused[3] and not tapes.wants(3)
    full = [wide for rows, wide in widths if rows == 3]
    assert full[: 1 + RECORD_ATTEMPTS] == [True] * (1 + RECORD_ATTEMPTS)
    assert full[1 + RECORD_ATTEMPTS:] and not any(full[1 + RECORD_ATTEMPTS:])
    llm.engine_core.shutdown()
