"""The bulk-copy GEMV on a Hopper GPU: each mode (plain, the input's add + RMSNorm, SwiGLU)
against float64 on fresh random inputs, the new residual and the normalized row with the RMSNorm
kernel's bits, odd shapes (fewer rows than SMs, rows that do not fill a stage), every
configuration shape (threads per row below, at and above a warp), CUDA graph replays and a
launch tape against the eager call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cadence.model.bulk_gemv import BulkConfig, bulk_applies, bulk_gemv, bulk_gemv_norm
from cadence.model.fused_ops import add_rms_norm, rms_norm, silu_and_mul

EPS = 1e-6
CONFIGS = [BulkConfig(1, 4, 256), BulkConfig(4, 3, 256), BulkConfig(8, 2, 128),
           BulkConfig(2, 6, 512), BulkConfig(16, 2, 256)]
SHAPES = [(1, 512), (37, 1024), (131, 2048), (1000, 1032), (3072, 4096)]


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU")]


def _operands(n: int, k: int, seed: int, glu: bool = False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).bfloat16()
    x = torch.randn(1, 2 * k if glu else k, device="cuda", generator=g).bfloat16()
    r = torch.randn(1, k, device="cuda", generator=g).bfloat16()
    nw = (1 + 0.2 * torch.randn(k, device="cuda", generator=g)).bfloat16()
    return w, x, r, nw


def _close(out: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> None:
    ref = F.linear(h.double(), w.double())
    # bf16 output rounding (2^-8 relative) plus float32 sums over K.
    tol = ref.abs() * 2**-7 + 1e-3 * float(ref.abs().max())
    assert out.shape == ref.shape
    assert bool(((out.double() - ref).abs() <= tol).all())


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("n,k", SHAPES)
def test_plain_against_float64(cfg: BulkConfig, n: int, k: int) -> None:
    w, x, _, _ = _operands(n, k, n + k)
    if not bulk_applies(x, w, cfg):
        pytest.skip("configuration does not fit")
    _close(bulk_gemv(x, w, cfg), x, w)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("n,k", SHAPES)
def test_swiglu_against_float64(cfg: BulkConfig, n: int, k: int) -> None:
    w, x, _, _ = _operands(n, k, 7 * n + k, glu=True)
    if not bulk_applies(x, w, cfg, "glu"):
        pytest.skip("configuration does not fit")
    # silu_and_mul's own kernel rounds as the bulk kernel does: within a rounding of it.
    _close(bulk_gemv(x, w, cfg, glu=True), silu_and_mul(x), w)


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("n,k", SHAPES)
def test_norm_has_the_norm_kernels_bits(cfg: BulkConfig, n: int, k: int, residual: bool) -> None:
    w, x, r, nw = _operands(n, k, 3 * n + k)
    if not bulk_applies(x, w, cfg, "norm", r if residual else None, nw):
        pytest.skip("configuration does not fit")
    out, s = bulk_gemv_norm(x, r if residual else None, nw, EPS, w, cfg)
    if residual:
        h, s_ref = add_rms_norm(x, r, nw, EPS)
        assert torch.equal(s, s_ref)
    else:
        h = rms_norm(x, nw, EPS)
        assert s is x
    # The normalized row is the RMSNorm kernel's bit for bit: a plain launch on it gives the
    # fused launch's output exactly (the same dot products, in the same order).
    assert torch.equal(out, bulk_gemv(h, w, cfg))
    _close(out, h, w)


def test_norm_refuses_short_rows_and_misaligned_inputs() -> None:
    cfg = BulkConfig(4, 3, 256)
    w, x, r, nw = _operands(64, 256, 1)
    assert bulk_applies(x, w, cfg) and not bulk_applies(x, w, cfg, "norm", r, nw)
    w, x, r, nw = _operands(64, 1024, 1)
    assert bulk_applies(x, w, cfg, "norm", r, nw) and bulk_applies(x, w, cfg, "norm", None, nw)
    assert not bulk_applies(x, w, cfg, "norm", r, None)
    shifted_nw = torch.empty(1024 + 8, device="cuda", dtype=torch.bfloat16)[1:1025]
    assert not bulk_applies(x, w, cfg, "norm", r, shifted_nw)
    assert not bulk_applies(x, w, cfg, "norm", r[:, :512], nw)
    shifted = torch.empty(1, 1024 + 8, device="cuda", dtype=torch.bfloat16)[:, 1:1025]
    assert not bulk_applies(shifted, w, cfg)
    assert not bulk_applies(x.float(), w.float(), cfg)
    assert not bulk_applies(x, w[:, :1020], cfg)


@pytest.mark.parametrize("mode", ["plain", "norm", "glu"])
def test_graph_and_tape_replays_match_the_eager_call(mode: str) -> None:
    from cadence.runtime.launch_tape import LaunchTape, recording

    cfg = BulkConfig(4, 4, 256)
    n, k = 2048, 2048
    w, x, r, nw = _operands(n, k, 11, glu=mode == "glu")

    def call() -> torch.Tensor:
        if mode == "norm":
            return bulk_gemv_norm(x, r, nw, EPS, w, cfg)[0]
        return bulk_gemv(x, w, cfg, glu=mode == "glu")

    eager = call()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    captured.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)

    with recording() as rec:
        taped = call()
    assert rec.refused is None and len(rec.launches) == 1
    tape = LaunchTape(rec)
    taped.zero_()
    tape.replay()
    torch.cuda.synchronize()
    assert torch.equal(taped, eager)


def test_decode_step_takes_the_bulk_kernels(monkeypatch) -> None:
    """A one-token decode step of a model with Qwen3-0.6B's layer shapes (the table's): every
    layer's four projections take the bulk kernels (not the MLP block), eagerly and in a CUDA
    graph with the same logits, and the logits agree with the other kernels' within bf16."""
    from cadence.model import bulk_gemv as bulk_module
    from cadence.model import skinny_gemm
    from cadence.model.decoder import CausalLM
    from cadence.model.triton_backend import TritonAttentionBackend
    from tests.model.helpers import Chunk, cuda_args, hf_config, make_batch, new_kv_caches

    if torch.cuda.get_device_capability() != bulk_module.TABLE_CAPABILITY:
        pytest.skip("the table was measured on another device")
    config = hf_config("qwen3", tie=False)
    config.update(dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, num_hidden_layers=2))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = CausalLM(config, TritonAttentionBackend()).to(torch.bfloat16)
    model.reset_buffers()
    caches = [c.cuda() for c in new_kv_caches(model, torch.bfloat16)]
    model.bind_kv_caches(caches)
    calls = []
    for name in ("bulk_gemv", "bulk_gemv_norm"):
        real = getattr(skinny_gemm, name)
        monkeypatch.setattr(skinny_gemm, name,
                            lambda *a, _real=real, _name=name, **kw: calls.append(_name)
                            or _real(*a, **kw))
    prompt, table = [3, 4, 5, 6, 7], [1, 2]
    prefill = make_batch([Chunk(prompt, 0, table)])
    step = make_batch([Chunk([9], len(prompt), table)])  # one row: no padding
    ids, pos, md = cuda_args(step)
    with torch.no_grad():
        model(*cuda_args(prefill))
        saved = [c.clone() for c in caches]
        results = {}
        for enabled in (True, False):
            monkeypatch.setattr(bulk_module, "ENABLED", enabled)
            for module in model.modules():  # plans made with the other setting
                module.__dict__.pop("_skinny_plans", None)
            for cache, before in zip(caches, saved, strict=True):
                cache.copy_(before)
            calls.clear()
            eager = model.compute_logits(model(ids, pos, md)[:1])
            taken = list(calls)
            model(ids, pos, md)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = model(ids, pos, md)
            for cache, before in zip(caches, saved, strict=True):
                cache.copy_(before)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(model.compute_logits(captured[:1]), eager)
            results[enabled] = (eager, taken)
    layers = config.num_hidden_layers
    assert sorted(results[True][1]) == sorted(["bulk_gemv"] * 2 * layers
                                              + ["bulk_gemv_norm"] * 2 * layers)
    assert results[False][1] == []
    on, off = results[True][0].float(), results[False][0].float()
    assert float((on - off).abs().max()) <= 3e-2 * float(off.abs().max())
