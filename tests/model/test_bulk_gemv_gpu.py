"""The bulk-copy GEMV on a Hopper GPU: each mode (plain, the input's add + RMSNorm, SwiGLU), with
bfloat16 and with e4m3 weights, against float64 on fresh random inputs, the new residual and the normalized row with the RMSNorm
kernel's bits, odd shapes (fewer rows than SMs, rows that do not fill a stage), every
configuration shape (threads per row below, at and above a warp), CUDA graph replays and a
launch tape against the eager call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cadence.model.bulk_gemv import BulkConfig, bulk_applies, bulk_gemv, bulk_gemv_norm
from cadence.model.fp8 import quantize_rows
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


FP8_SHAPES = [(1, 512), (37, 1024), (131, 2048), (1000, 1040), (3072, 4096), (257, 14336)]
# e4m3 -> f16 by integer operations, and by the hardware conversion (with registers or not).
FP8_CONFIGS = CONFIGS + [BulkConfig(4, 3, 256, hw_cvt=True), BulkConfig(16, 2, 512, hw_cvt=True),
                         BulkConfig(8, 2, 256, hw_cvt=True), BulkConfig(1, 2, 128, hw_cvt=True)]


def _fp8_operands(n: int, k: int, seed: int, glu: bool = False, spread: float = 1.0):
    w, x, r, nw = _operands(n, k, seed, glu)
    q, scale = quantize_rows(w)
    return q, scale, (spread * x.float()).bfloat16(), r, nw


def _close_fp8(out: torch.Tensor, h: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    _close(out, h, q.double() * scale.double()[:, None])


@pytest.mark.parametrize("mode", ["plain", "glu", "norm"])
@pytest.mark.parametrize("cfg", FP8_CONFIGS, ids=str)
@pytest.mark.parametrize("n,k", FP8_SHAPES)
def test_fp8_weights_against_float64(cfg: BulkConfig, n: int, k: int, mode: str) -> None:
    q, scale, x, r, nw = _fp8_operands(n, k, 5 * n + k, glu=mode == "glu")
    if not bulk_applies(x, q, cfg, mode, r, nw, scale):
        pytest.skip("configuration does not fit")
    if mode == "norm":
        out, s = bulk_gemv_norm(x, r, nw, EPS, q, cfg, scale)
        h, s_ref = add_rms_norm(x, r, nw, EPS)
        assert torch.equal(s, s_ref)
        assert torch.equal(out, bulk_gemv(h, q, cfg, scale=scale))
    elif mode == "glu":
        out, h = bulk_gemv(x, q, cfg, glu=True, scale=scale), silu_and_mul(x)
    else:
        out, h = bulk_gemv(x, q, cfg, scale=scale), x
    _close_fp8(out, h, q, scale)


@pytest.mark.parametrize("hw_cvt", [False, True])
@pytest.mark.parametrize("spread", [1e-30, 1e4, 1e36])
def test_fp8_inputs_far_from_one(spread: float, hw_cvt: bool) -> None:
    # The input's f16 copy is scaled by a power of two: tiny and huge rows keep their precision
    # and no product or sum leaves f16's range.
    q, scale, x, _, _ = _fp8_operands(512, 2048, 17, spread=spread)
    _close_fp8(bulk_gemv(x, q, BulkConfig(4, 3, 256, hw_cvt=hw_cvt), scale=scale), x, q, scale)


def test_fp8_needs_its_scale_and_sixteen_wide_rows() -> None:
    cfg = BulkConfig(4, 3, 256)
    q, scale, x, r, nw = _fp8_operands(64, 1024, 2)
    assert bulk_applies(x, q, cfg, scale=scale)
    assert not bulk_applies(x, q, cfg)
    assert not bulk_applies(x, q, cfg, scale=scale.double())
    assert not bulk_applies(x, q, cfg, scale=scale[:32])
    q2, s2, x2, _, _ = _fp8_operands(64, 1032, 2)
    assert not bulk_applies(x2, q2, cfg, scale=s2)  # K not a multiple of 16


@pytest.mark.parametrize("hw_cvt", [False, True])
def test_fp8_graph_replay_matches_the_eager_call(hw_cvt: bool) -> None:
    cfg = BulkConfig(8, 3, 256, hw_cvt=hw_cvt)
    q, scale, x, r, nw = _fp8_operands(4096, 4096, 23)
    eager = bulk_gemv_norm(x, r, nw, EPS, q, cfg, scale)[0]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        bulk_gemv_norm(x, r, nw, EPS, q, cfg, scale)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = bulk_gemv_norm(x, r, nw, EPS, q, cfg, scale)[0]
    captured.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_fp8_engine_takes_the_kernel_at_one_row(tmp_path, monkeypatch) -> None:
    # A random Llama under --quantization fp8 whose shapes the e4m3 table is made to list: a
    # lone request's decode steps run the kernel for all four projections (counted), and CUDA
    # graphs give the eager tokens, with the table and without it (the weight-only kernel).
    import transformers

    from cadence.engine.llm import LLM
    from cadence.model import bulk_gemv as bg
    from cadence.sampling_params import SamplingParams
    from tests.hf_models import hf_config

    if torch.cuda.get_device_capability() != bg.TABLE_CAPABILITY:
        pytest.skip("the table was measured on another device")
    config = hf_config("llama", False, 10000.0, vocab_size=512, hidden_size=512,
                       intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                       eos_token_id=2)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    hf.save_pretrained(tmp_path)
    launches = []
    run = bg._run

    def counted(*args, **kwargs):
        if args[1].dtype == bg.FP8:
            launches.append(args[3])  # the mode
        return run(*args, **kwargs)

    monkeypatch.setattr(bg, "_run", counted)
    prompt = [{"prompt_token_ids": [5, 77, 301, 9, 42, 8, 130]}]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = {}
    for listed in (True, False):
        for n, k, mode in ((1024, 512, "norm"), (512, 512, "plain"), (2048, 512, "norm"),
                           (512, 1024, "glu")):
            if listed:
                monkeypatch.setitem(bg.BULK_FP8_CONFIGS, (n, k, mode),
                                    BulkConfig(4, 2, 256, hw_cvt=True))
            else:
                bg.BULK_FP8_CONFIGS.pop((n, k, mode), None)
        for eager in (False, True):
            launches.clear()
            llm = LLM(str(tmp_path), dtype="bfloat16", quantization="fp8", enforce_eager=eager,
                      max_model_len=256, max_num_seqs=4, gpu_memory_utilization=0.3,
                      max_num_batched_tokens=512)
            try:
                outs[listed, eager] = llm.generate(prompt, params)[0].outputs[0].token_ids
            finally:
                llm.engine_core.shutdown()
            if listed:
                assert {0, 1, 2} <= set(launches), launches[:8]
            else:
                assert launches == []
    assert outs[True, False] == outs[True, True]
    assert outs[False, False] == outs[False, True]
