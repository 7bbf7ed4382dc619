"""The decoder's (residual add +) RMSNorm in the skinny GEMM's loads on a GPU: the bits of the
RMSNorm kernel then the GEMM (split-K, CUDA graphs, the real shapes, planned launches), the sum
of squares' order under every layout, the late norm against float64, and a decode step with and
without the fusion."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cadence.model import fused_ops, skinny_gemm
from cadence.model.decoder import CausalLM
from cadence.model.rms_norm_kernels import norm_chunk
from cadence.model.skinny_gemm import SkinnyConfig, SkinnyLinear, heuristic_config
from cadence.model.skinny_gemm_kernels import row_bucket, skinny_matmul, skinny_matmul_norm
from tests.model.helpers import hf_config
from tests.model.skinny_norm_cases import (
    EPS,
    REAL_SHAPES,
    SMALL_CONFIGS,
    SMALL_SHAPES,
    check_fused,
    check_late,
    check_sum_order,
    late_reference,
    norm_operands,
    two_kernels,
)


def _skinny(k: int, n: int, dtype: torch.dtype, bias: bool) -> SkinnyLinear:
    layer = nn.Linear(k, n, bias=bias).to(dtype)
    layer.__class__ = SkinnyLinear
    return layer


@pytest.mark.gpu
def test_sum_order_on_gpu():
    check_sum_order("cuda", torch.bfloat16, (1, 2, 4, 8))
    check_sum_order("cuda", torch.float16, (4,))


@pytest.mark.gpu
@pytest.mark.parametrize("width", [17, 1000, 1024, 4096])
def test_norm_kernel_bits_do_not_depend_on_its_warps(width):
    from cadence.model.rms_norm_kernels import _rms_norm_kernel
    from cadence.runtime.triton_launch import next_pow2

    x, r, nw, _, _ = norm_operands(3, 1, width, torch.bfloat16, "cuda")
    want, want_s = fused_ops.add_rms_norm_triton(x, r, nw, EPS)
    for num_warps in (1, 2, 4, 8):
        out, s = torch.empty_like(x), torch.empty_like(x)
        _rms_norm_kernel[(3,)](x, r, nw, out, s, width, width, width, width, EPS, N=width,
                               HAS_RESIDUAL=True, BLOCK=next_pow2(width),
                               CHUNK=norm_chunk(width), num_warps=num_warps)
        assert torch.equal(out, want) and torch.equal(s, want_s), num_warps


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("cfg", SMALL_CONFIGS, ids=str)
def test_fused_paths_on_gpu(cfg, dtype):
    for m, n, k in SMALL_SHAPES + [(8, 1000, 1000), (4, 4100, 1030)]:
        check_fused("cuda", dtype, m, n, k, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("n,k", REAL_SHAPES, ids=[f"{n}x{k}" for n, k in REAL_SHAPES])
def test_real_shapes_bit_for_bit(n, k, rows):
    """The table's, the heuristic's and a one-row configuration at the real shapes."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfgs = {heuristic_config(row_bucket(rows), n, k, sms)}
    if skinny_gemm.SKINNY_CONFIGS.get((n, k, row_bucket(rows))):
        cfgs.add(skinny_gemm.SKINNY_CONFIGS[(n, k, row_bucket(rows))])
    if rows <= 4:
        cfgs.add(SkinnyConfig(8, 512, 1, num_warps=4, num_stages=1, dot=False))
    for cfg in cfgs:
        check_fused("cuda", torch.bfloat16, rows, n, k, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", SMALL_CONFIGS, ids=str)
def test_late_norm_paths_on_gpu(cfg):
    for m, n, k in SMALL_SHAPES + [(8, 1000, 1000), (4, 4100, 1030)]:
        check_late("cuda", torch.bfloat16, m, n, k, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("n,k", REAL_SHAPES, ids=[f"{n}x{k}" for n, k in REAL_SHAPES])
def test_late_norm_real_shapes(n, k, rows):
    """The late norm at the configuration the decoder would take, the heuristic's and a
    one-row configuration, at the real shapes."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfgs = {heuristic_config(row_bucket(rows), n, k, sms)}
    chosen = skinny_gemm._choose_norm(torch.device("cuda", 0), n, k, row_bucket(rows), True)
    if chosen is not None:
        cfgs.add(chosen)
    if rows <= 4:
        cfgs.add(SkinnyConfig(8, 512, 1, num_warps=4, num_stages=1, dot=False))
    for cfg in cfgs:
        check_late("cuda", torch.bfloat16, rows, n, k, cfg)


def _graph_config(rows: int, split: int) -> SkinnyConfig:
    """Tensor-core tiles past one row, multiply-adds at one; ``split`` K slices."""
    dot = rows > 1
    return SkinnyConfig(block_n=64 if dot else 16, block_k=128 if dot else 512, split_k=split,
                        num_warps=4 if dot else 8, num_stages=3 if dot else 1, dot=dot)


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 4])
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_late_norm_inside_a_cuda_graph(rows, split):
    """Replays of a captured late-norm launch (split slices' sums of squares through the
    workspace) give the eager launch's bits on fresh inputs; the counters end at zero."""
    from cadence.model import skinny_gemm_kernels

    n, k = 6144, 4096
    cfg = _graph_config(rows, split)
    x, r, nw, w, b = norm_operands(rows, n, k, torch.bfloat16, "cuda", seed=1)
    static_x, static_r = x.clone(), r.clone()
    skinny_matmul_norm(static_x, static_r, nw, EPS, w, b, cfg, late_norm=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, s = skinny_matmul_norm(static_x, static_r, nw, EPS, w, b, cfg, late_norm=True)
    for seed in (2, 3):
        fresh_x, fresh_r, _, _, _ = norm_operands(rows, n, k, torch.bfloat16, "cuda", seed=seed)
        static_x.copy_(fresh_x)
        static_r.copy_(fresh_r)
        graph.replay()
        want, want_s = skinny_matmul_norm(fresh_x, fresh_r, nw, EPS, w, b, cfg, late_norm=True)
        torch.cuda.synchronize()
        assert torch.equal(out, want) and torch.equal(s, want_s)
    assert int(skinny_gemm_kernels._SCRATCH[0][0].count_nonzero()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 4])
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_fused_inside_a_cuda_graph(rows, split):
    from cadence.model import skinny_gemm_kernels

    n, k = 6144, 1024
    cfg = _graph_config(rows, split)
    x, r, nw, w, b = norm_operands(rows, n, k, torch.bfloat16, "cuda", seed=1)
    static_x, static_r = x.clone(), r.clone()
    skinny_matmul_norm(static_x, static_r, nw, EPS, w, b, cfg)  # compiles, outside the capture
    skinny_matmul_norm(static_x, None, nw, EPS, w, b, cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, s = skinny_matmul_norm(static_x, static_r, nw, EPS, w, b, cfg)
        first_out, _ = skinny_matmul_norm(static_x, None, nw, EPS, w, b, cfg)
    for seed in (2, 3, 4):
        fresh_x, fresh_r, _, _, _ = norm_operands(rows, n, k, torch.bfloat16, "cuda", seed=seed)
        static_x.copy_(fresh_x)
        static_r.copy_(fresh_r)
        graph.replay()
        want, want_s = two_kernels(fresh_x, fresh_r, nw, w, b, cfg)
        want_first, _ = two_kernels(fresh_x, None, nw, w, b, cfg)
        torch.cuda.synchronize()
        assert torch.equal(out, want) and torch.equal(s, want_s)
        assert torch.equal(first_out, want_first)
    assert int(skinny_gemm_kernels._SCRATCH[0][0].count_nonzero()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("late_pass", [False, True], ids=["exact", "late"])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_norm_plans_graphs_and_fallbacks(monkeypatch, bias, late_pass):
    """SkinnyLinear.forward_norm: up to NORM_MAX_ROWS rows one launch with the bits of the
    two kernels at the fused configuration; with the rows counted as wide, one late-norm launch
    at one row, within float64's result; both on first calls, planned calls, a CUDA graph,
    aligned and misaligned inputs; past them the two calls; the two calls with the switch set."""
    from cadence.model import bulk_gemv, bulk_mma, skinny_gemm_kernels

    # The bulk kernels take a bias-free call first where their tables list its shape (as
    # here); this test is the skinny kernel's (the bulk kernels' own are test_bulk_*_gpu.py).
    monkeypatch.setattr(bulk_gemv, "ENABLED", False)
    monkeypatch.setattr(bulk_mma, "ENABLED", False)
    torch.manual_seed(0)
    n, k = 4096, 1024  # Qwen3-0.6B's qkv projection
    if late_pass:  # 1024 counts as wide: one row takes the late norm at a listed configuration
        monkeypatch.setattr(skinny_gemm, "NORM_MAX_K", 512)
        monkeypatch.setattr(skinny_gemm, "LATE_NORM_CONFIGS",
                            {(n, k, 1): SkinnyConfig(16, 512, 1, 4, 1, False)})
        monkeypatch.setattr(skinny_gemm, "_CHOSEN_NORM", {})
    layer = _skinny(k, n, torch.bfloat16, bias).cuda()
    nw = (1 + 0.2 * torch.randn(k, device="cuda")).to(torch.bfloat16)
    calls = []
    real = skinny_gemm.skinny_matmul_norm
    monkeypatch.setattr(skinny_gemm, "skinny_matmul_norm",
                        lambda *a: calls.append(a) or real(*a))
    buf = torch.randn(2, 17 * k + 1, device="cuda").to(torch.bfloat16)  # up to 17 rows, offset 1
    with torch.no_grad():
        for rows in (1, 3, 4, 5, 17):
            for off in (0, 1):
                x = buf[0, off : off + rows * k].view(rows, k)
                for r in (buf[1, off : off + rows * k].view(rows, k), None):
                    h, want_s = (fused_ops.rms_norm(x, nw, EPS), x) if r is None else (
                        fused_ops.add_rms_norm(x, r, nw, EPS))
                    mode = skinny_gemm.norm_fusion(rows, k, x.dtype)
                    exact, late = mode == "exact", mode == "late"
                    assert late == (late_pass and rows == 1)
                    if exact:
                        cfg = skinny_gemm._choose_norm(x.device, n, k, row_bucket(rows))
                        want = skinny_matmul(h, layer.weight, layer.bias, cfg)
                    elif not late:
                        want = layer(h)
                    before = len(calls)
                    got = [layer.forward_norm(x, r, nw, EPS) for _ in range(3)]
                    assert len(calls) - before == (1 if exact or late else 0)  # then the plan
                    if late:  # the first call's result, against float64's; the plans repeat it
                        want = got[0][0]
                        ref = late_reference(want_s, nw, layer.weight, layer.bias)
                        err = (want.double().cpu() - ref).abs().max()
                        assert err <= 2e-2 * ref.abs().max(), err
                    for out, s in got:
                        assert torch.equal(out, want) and torch.equal(s, want_s)
                    static_x = x.clone()
                    static_r = None if r is None else r.clone()
                    layer.forward_norm(static_x, static_r, nw, EPS)  # plan their alignment
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        out, s = layer.forward_norm(static_x, static_r, nw, EPS)
                    graph.replay()
                    torch.cuda.synchronize()
                    assert torch.equal(out, want) and torch.equal(s, want_s)
        assert int(skinny_gemm_kernels._SCRATCH[0][0].count_nonzero()) == 0
        monkeypatch.setattr(skinny_gemm, "NORM_MAX_ROWS", 0)
        monkeypatch.setattr(skinny_gemm, "LATE_NORM_MAX_ROWS", 0)
        x, r = buf[0, : 2 * k].view(2, k), buf[1, : 2 * k].view(2, k)
        h, want_s = fused_ops.add_rms_norm(x, r, nw, EPS)
        before = len(calls)
        out, s = layer.forward_norm(x, r, nw, EPS)
        assert len(calls) == before and torch.equal(out, layer(h)) and torch.equal(s, want_s)


def _decode_model(num_layers: int) -> tuple[CausalLM, list[torch.Tensor]]:
    from cadence.model.triton_backend import TritonAttentionBackend
    from tests.model.helpers import new_kv_caches

    config = hf_config("qwen3", tie=False)
    config.num_hidden_layers = num_layers
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = CausalLM(config, TritonAttentionBackend()).to(torch.bfloat16)
    model.reset_buffers()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    caches = [c.cuda() for c in new_kv_caches(model, torch.bfloat16)]
    model.bind_kv_caches(caches)
    return model, caches


@pytest.mark.gpu
def test_decode_step_with_and_without_the_fusion(monkeypatch):
    """A decode step of 3 rows gives the same logits with the norms fused and with the norm
    kernels (the tiny model's projections take the same configuration either way), and within
    a rounding of them as late norms, eagerly and as a CUDA graph, whose kernels are two per
    layer fewer."""
    from cadence.runtime.graph_launch import graph_kernel_count
    from tests.model.helpers import Chunk, cuda_args, make_batch

    num_layers = 4
    model, caches = _decode_model(num_layers)
    # The late norm runs only at configurations its table lists (measured shapes): list the
    # tiny model's norm-fed projections, at this device, for the late pass below.
    late_cfg = SkinnyConfig(16, 64, 1, 4, 1, False)
    layer = model.model.layers[0]
    late_table = {(*p.weight.shape, row_bucket(3)): late_cfg
                  for p in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj)}
    monkeypatch.setattr(skinny_gemm, "LATE_NORM_CONFIGS", late_table)
    monkeypatch.setattr(skinny_gemm, "TABLE_CAPABILITY", torch.cuda.get_device_capability())
    monkeypatch.setattr(skinny_gemm, "_CHOSEN_NORM", {})
    tables = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    prompts = [[3, 4, 5, 6, 7], [9, 10], [11, 12, 13, 14, 15, 16, 17, 18]]
    prefill = make_batch([Chunk(p, 0, t) for p, t in zip(prompts, tables, strict=True)])
    step = make_batch([Chunk([5], len(p), t) for p, t in zip(prompts, tables, strict=True)], 1)
    ids, pos, md = cuda_args(step)
    results = {}
    with torch.no_grad():
        model(*cuda_args(prefill))
        saved = [c.clone() for c in caches]
        for limit, late_limit in ((4, 0), (0, 0), (0, 16)):
            monkeypatch.setattr(skinny_gemm, "NORM_MAX_ROWS", limit)
            monkeypatch.setattr(skinny_gemm, "LATE_NORM_MAX_ROWS", late_limit)
            # The tiny model's rows (64) count as wide for the late norm.
            monkeypatch.setattr(skinny_gemm, "NORM_MAX_K", 32 if late_limit else 2048)
            for cache, before in zip(caches, saved, strict=True):
                cache.copy_(before)
            eager = model.compute_logits(model(ids, pos, md)[:3])
            model(ids, pos, md)  # warm-up (plans) outside the capture
            graph = torch.cuda.CUDAGraph(keep_graph=True)
            with torch.cuda.graph(graph):
                captured = model(ids, pos, md)
            graph.instantiate()
            # Another step's values in every buffer the graph's kernels must overwrite: a
            # kernel missing from the graph leaves them, and the logits differ.
            model(torch.remainder(ids + 7, model.vocab_size), pos, md)
            for cache, before in zip(caches, saved, strict=True):
                cache.copy_(before)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(model.compute_logits(captured[:3]), eager)
            results[limit, late_limit] = (eager, graph_kernel_count(graph.raw_cuda_graph()))
    exact, unfused, late = results[4, 0], results[0, 0], results[0, 16]
    assert torch.equal(exact[0], unfused[0])
    assert unfused[1] - exact[1] == 2 * num_layers == unfused[1] - late[1], results
    diff = (late[0].float() - unfused[0].float()).abs().max()
    assert diff <= 3e-2 * unfused[0].float().abs().max(), diff
