"""The one-launch MLP block (o_proj, add + RMSNorm, gate_up, SwiGLU, down for one token) against
float64 references and the unfused kernels, its dispatch rules, and the decoder's use of it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":  # the interpreter driver: before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402
import torch  # noqa: E402

from cadence.model import mlp_block as mlp_block_module  # noqa: E402
from cadence.model.decoder import CausalLM  # noqa: E402
from cadence.model.mlp_block import MAX_WIDTH, block_applies, mlp_block  # noqa: E402
from tests.model.helpers import hf_config  # noqa: E402
from tests.model.triton_interpreter import DONE, patch_interpreter, run_interpreted  # noqa: E402

# (hidden, q width, intermediate): powers of two, widths that are not, and a hidden size below
# the tile's rows times the programs (programs with no tile).
SHAPES = [(64, 128, 96), (40, 72, 100), (16, 32, 24)]
EPS = 1e-6


def _operands(hidden: int, q: int, inter: int, dtype: torch.dtype, device: str, seed: int
              ) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device).manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    a = randn(1, q)
    residual = randn(1, hidden)
    o_w = randn(hidden, q, scale=q**-0.5)
    norm_w = (torch.rand(hidden, generator=gen, device=device) + 0.5).to(dtype)
    gate_up_w = randn(2 * inter, hidden, scale=hidden**-0.5)
    down_w = randn(hidden, inter, scale=inter**-0.5)
    return a, residual, o_w, norm_w, gate_up_w, down_w


def _round(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).double()


def _close(got: torch.Tensor, want: torch.Tensor, units: float) -> None:
    """Within ``units`` units in the last place of the dtype (float32: of float32 sums in
    another order), relative to the largest value."""
    eps = {torch.float32: 2.0**-20, torch.float16: 2.0**-10,
           torch.bfloat16: 2.0**-7}[got.dtype]  # fmt: skip
    scale = max(1.0, want.abs().max().item())
    torch.testing.assert_close(got.double(), want, atol=units * eps * scale, rtol=units * eps)


def check_block(device: str, dtype: torch.dtype, hidden: int, q: int, inter: int) -> None:
    """Each phase against float64 from the phase before's output (the kernel's scratch), so
    that a half-precision rounding landing one unit apart does not carry: o_proj, the residual
    sum (exact), RMSNorm, gate_up and SwiGLU, then down_proj. Three launches in a row: other
    inputs (the scratch and counters of the launch before are not read), then the first inputs
    again (the same bits)."""
    a, residual, o_w, norm_w, gate_up_w, down_w = _operands(hidden, q, inter, dtype, device,
                                                          seed=hidden + q + inter)
    assert block_applies(1, dtype, a.device, residual, o_w, norm_w, gate_up_w, down_w)
    first = _check_launch(device, a, residual, o_w, norm_w, gate_up_w, down_w)
    _check_launch(device, -2 * a, residual.flip(-1), o_w, norm_w, gate_up_w, down_w)
    again = mlp_block(a, residual, o_w, norm_w, EPS, gate_up_w, down_w)
    assert again is not None and torch.equal(again[0], first[0])
    assert torch.equal(again[1], first[1])
    counters = mlp_block_module._SCRATCH[(a.device.index, dtype, hidden, inter)][2]
    assert int(counters.count_nonzero()) == 0


def _check_launch(device: str, a: torch.Tensor, residual: torch.Tensor, o_w: torch.Tensor,
                  norm_w: torch.Tensor, gate_up_w: torch.Tensor, down_w: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    dtype, hidden, inter = a.dtype, o_w.shape[0], down_w.shape[1]
    got = mlp_block(a, residual, o_w, norm_w, EPS, gate_up_w, down_w)
    assert got is not None
    out, new_residual = got
    assert out.shape == (1, hidden) and out.dtype == dtype
    assert new_residual.shape == residual.shape and new_residual.dtype == dtype
    o_buf, act_buf, _ = mlp_block_module._SCRATCH[(a.device.index, dtype, hidden, inter)]
    _close(o_buf, (a.double() @ o_w.double().T)[0], 1)
    s = _round(o_buf.double() + residual.double()[0], dtype)
    if device == "cuda":
        assert torch.equal(new_residual.double()[0], s)
    else:  # the interpreter rounds float32 to bfloat16 ties away from even
        _close(new_residual[0], s, 1)
    rstd = torch.rsqrt(s.pow(2).mean() + EPS)
    h = _round(_round(s * rstd, dtype) * norm_w.double(), dtype)
    gate, up = (h @ gate_up_w.double().T).chunk(2)
    gate, up = _round(gate, dtype), _round(up, dtype)
    act = _round(_round(gate * torch.sigmoid(gate), dtype) * up, dtype)
    _close(act_buf, act, 4)  # gate and up a unit apart each, then two roundings
    _close(out, (act_buf.double() @ down_w.double().T)[None], 1)
    return out, new_residual


def check_decoder(device: str) -> None:
    """A one-token step through the decoder takes the block in every layer and gives what the
    unfused kernels give; a two-token step does not take it, nor a layer whose projection has
    a bias; a launch that cannot run (None) leaves the layer to the unfused kernels, with
    their bits."""
    from cadence.model.attention import TorchAttentionBackend
    from tests.model.helpers import Chunk, cuda_args, make_batch, new_kv_caches, run_ours

    def run(model: CausalLM, batch) -> torch.Tensor:  # type: ignore[no-untyped-def]
        if device == "cpu":
            return run_ours(model, batch)
        hidden = model(*cuda_args(batch))
        return model.compute_logits(hidden[: batch.metadata.num_actual_tokens])

    torch.manual_seed(0)
    model = CausalLM(hf_config("qwen3", tie=False), TorchAttentionBackend()).to(device)
    model.reset_buffers()
    caches = [c.to(device) for c in new_kv_caches(model, torch.float32)]
    model.bind_kv_caches(caches)
    prefill = make_batch([Chunk([3, 4, 5, 6, 7], 0, [1, 2])])
    step = make_batch([Chunk([9], 5, [1, 2])])
    two = make_batch([Chunk([9], 5, [1, 2]), Chunk([4, 5], 0, [3])])
    calls = []
    real = mlp_block_module.mlp_block
    refuse = []  # set: every launch "cannot run"

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return None if refuse else real(*args, **kwargs)

    def step_again() -> torch.Tensor:
        for cache, before in zip(caches, saved, strict=True):
            cache.copy_(before)
        return run(model, step)

    import cadence.model.decoder as decoder

    original = decoder.mlp_block
    decoder.mlp_block = counted
    try:
        with torch.no_grad():
            run(model, prefill)
            saved = [c.clone() for c in caches]
            assert not calls
            ours = run(model, step)
            assert len(calls) == model.num_layers
            mlp_block_module.ENABLED = False
            theirs = step_again()
            mlp_block_module.ENABLED = True
            assert len(calls) == model.num_layers
            run(model, two)
            assert len(calls) == model.num_layers
            refuse.append(True)
            assert torch.equal(step_again(), theirs)
            assert len(calls) == 2 * model.num_layers
            refuse.clear()
            down = model.model.layers[0].mlp.down_proj
            down.bias = torch.nn.Parameter(torch.zeros(down.out_features, device=device))
            step_again()
            assert len(calls) == 3 * model.num_layers - 1  # not layer 0
    finally:
        decoder.mlp_block = original
        mlp_block_module.ENABLED = True
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=2e-5)


def run_interpreter_cases() -> None:
    for hidden, q, inter in SHAPES:
        check_block("cpu", torch.float32, hidden, q, inter)
        check_block("cpu", torch.bfloat16, hidden, q, inter)
    check_decoder("cpu")


# --- CPU ----------------------------------------------------------------------------------------


@pytest.mark.timeout(600)  # the interpreter's subprocess, minutes on 2 cores
def test_block_in_triton_interpreter():
    run_interpreted(__file__)


def _valid(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    return _operands(64, 128, 96, dtype, "cpu", seed=0)[1:]


def test_block_applies_to_one_row_of_plain_weights(monkeypatch):
    monkeypatch.setattr(mlp_block_module, "_INTERPRETED", True)
    cpu = torch.device("cpu")
    assert block_applies(1, torch.float32, cpu, *_valid())
    assert not block_applies(2, torch.float32, cpu, *_valid())  # one token only
    assert not block_applies(1, torch.float64, cpu, *_operands(64, 128, 96, torch.float64, "cpu",
                                                                 seed=0)[1:])
    residual, o_w, norm_w, gate_up_w, down_w = _valid()
    assert not block_applies(1, torch.float32, cpu, residual, o_w.half(), norm_w, gate_up_w,
                             down_w)  # one dtype throughout
    assert not block_applies(1, torch.float32, cpu, residual, o_w, norm_w, gate_up_w[:-1],
                             down_w)  # gate | up halves
    assert not block_applies(1, torch.float32, cpu, residual, o_w, norm_w, gate_up_w,
                             down_w.T)  # not contiguous
    assert not block_applies(1, torch.float32, cpu, residual, o_w, norm_w[:-1], gate_up_w,
                             down_w)
    wide = _operands(64, 128, MAX_WIDTH + 1, torch.float32, "cpu", seed=0)[1:]
    assert not block_applies(1, torch.float32, cpu, *wide)  # a tile row held in registers
    with torch.enable_grad():
        grad = [t.clone().requires_grad_() for t in _valid()]
        assert not block_applies(1, torch.float32, cpu, *grad)
    monkeypatch.setattr(mlp_block_module, "ENABLED", False)
    assert not block_applies(1, torch.float32, cpu, *_valid())


def test_block_does_not_apply_on_the_cpu_backend():
    """Outside Triton's interpreter the CPU path keeps its torch arithmetic."""
    if mlp_block_module._INTERPRETED:
        pytest.skip("this process runs Triton's interpreter")
    assert not block_applies(1, torch.float32, torch.device("cpu"), *_valid())


# --- GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("hidden,q,inter", SHAPES + [(1024, 2048, 3072), (2048, 4096, 4096)])
def test_block_on_gpu(dtype, hidden, q, inter):
    check_block("cuda", dtype, hidden, q, inter)


@pytest.mark.gpu
def test_block_inside_a_cuda_graph_repeats_eager_bits():
    ops = _operands(1024, 2048, 3072, torch.bfloat16, "cuda", seed=3)
    static_a = ops[0].clone()
    eager = mlp_block(static_a, *ops[1:4], EPS, *ops[4:])  # compiles, allocates: not captured
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mlp_block(static_a, *ops[1:4], EPS, *ops[4:])
    assert eager is not None and captured is not None
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1])
    static_a.copy_(ops[0] * 2)  # new inputs through the same graph
    graph.replay()
    fresh = mlp_block(static_a, *ops[1:4], EPS, *ops[4:])
    torch.cuda.synchronize()
    assert fresh is not None and torch.equal(captured[0], fresh[0])


@pytest.mark.gpu
def test_decoder_takes_the_block_on_gpu():
    check_decoder("cuda")


if __name__ == "__main__":
    patch_interpreter()
    run_interpreter_cases()
    print(DONE)
