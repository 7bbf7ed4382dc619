"""Compare prefill attention implementations on one prompt prefilled from scratch (GPU).

    python scripts/prefill_attention_compare.py [--lens 1024,4096] [--heads 16 --kv-heads 8]

Times, for Qwen3-0.6B's heads by default: the engine's paged varlen kernel (its default tile,
keys from the cache), torch's bundled flash attention (varlen, keys from the contiguous k / v),
cuDNN's fused attention through torch (ragged, contiguous inputs; dense with grouped heads) and a
Triton kernel that reads q, k and v through TMA descriptors. Each is checked against
a float32 reference and, where it runs, captured in a CUDA graph and replayed. Prints us per
call and TFLOP/s of the causal attention work.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton
import triton.language as tl


@triton.jit
def _tma_tile(q, acc, m_i, l_i, k_desc, v_desc, n0, col, offs_m, qk_scale,
              BLOCK_N: tl.constexpr, MASK: tl.constexpr):  # fmt: skip
    """One key/value tile of the online softmax; MASK for the diagonal's tiles."""
    k = k_desc.load([n0, col])
    s = tl.dot(q, k.T) * qk_scale
    if MASK:
        offs_n = n0 + tl.arange(0, BLOCK_N)
        s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = v_desc.load([n0, col])
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _tma_attention(
    q_desc, k_desc, v_desc, o_ptr, stride_o, num_tokens, qk_scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Causal attention of one sequence; query block ``BLOCK_M`` rows of one head, the
    heaviest blocks first. BLOCK_M is a multiple of BLOCK_N. (Triton 3.6 compiles
    ``tl.range(..., warp_specialize=True)`` for sm_90 only with one such loop and 4 warps,
    and that kernel hung the H200: docs/perf.md, run BV.)"""
    mb = tl.num_programs(0) - 1 - tl.program_id(0)
    h = tl.program_id(1)
    col = (h // GROUP) * HEAD_DIM
    start_m = mb * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = q_desc.load([start_m, h * HEAD_DIM])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for n0 in range(0, start_m, BLOCK_N):
        acc, m_i, l_i = _tma_tile(q, acc, m_i, l_i, k_desc, v_desc, n0, col, offs_m, qk_scale,
                                  BLOCK_N, False)
    for n0 in range(start_m, start_m + BLOCK_M, BLOCK_N):
        acc, m_i, l_i = _tma_tile(q, acc, m_i, l_i, k_desc, v_desc, n0, col, offs_m, qk_scale,
                                  BLOCK_N, True)
    out = acc / l_i[:, None]
    ptrs = o_ptr + offs_m[:, None].to(tl.int64) * stride_o + h * HEAD_DIM + offs_d[None, :]
    tl.store(ptrs, out.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < num_tokens)


def tma_attention(q, k, v, out, scale, block_m=128, block_n=128, num_warps=8, num_stages=2):
    from triton.tools.tensor_descriptor import TensorDescriptor

    t, heads, dim = q.shape
    kv_heads = k.shape[1]
    q2, k2, v2 = (x.reshape(t, -1) if x.is_contiguous() else x.flatten(1) for x in (q, k, v))
    qd = TensorDescriptor.from_tensor(q2, [block_m, dim])
    kd = TensorDescriptor.from_tensor(k2, [block_n, dim])
    vd = TensorDescriptor.from_tensor(v2, [block_n, dim])
    grid = (triton.cdiv(t, block_m), heads)

    def call():
        _tma_attention[grid](
            qd, kd, vd, out, out.stride(0), t, scale * 1.4426950408889634,
            GROUP=heads // kv_heads, HEAD_DIM=dim, BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
        return out

    return call


def _public_cudnn(q, k, v, scale):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            is_causal=True, scale=scale, enable_gqa=True)  # fmt: skip
    return out[0].transpose(0, 1)


def time_length(t: int, h: int, hk: int, d: int, sms: int, only: list[str]) -> None:
    import torch
    from triton.testing import do_bench

    from cadence.model.triton_attention import paged_varlen_attention, store_kv_cache
    from scripts.attention_sweep import make

    scale = d**-0.5
    torch.manual_seed(0)
    _, cache, md, flops = make([(t, t)], h, hk, d)
    qkv = torch.randn(t, (h + 2 * hk) * d, dtype=torch.bfloat16, device="cuda")
    q = qkv[:, : h * d].view(t, h, d)
    k = qkv[:, h * d : (h + hk) * d].view(t, hk, d)
    v = qkv[:, (h + hk) * d :].view(t, hk, d)
    md.slot_mapping.copy_(torch.arange(16, 16 + t, device="cuda"))
    store_kv_cache(k, v, cache, md.slot_mapping)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1), k.float().transpose(0, 1), v.float().transpose(0, 1),
        is_causal=True, enable_gqa=True, scale=scale,
    ).transpose(0, 1)  # fmt: skip
    cu = torch.tensor([0, t], dtype=torch.int32, device="cuda")
    qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
    ke, ve = kc.repeat_interleave(h // hk, 1), vc.repeat_interleave(h // hk, 1)
    out = torch.empty(t, h, d, dtype=torch.bfloat16, device="cuda")
    aten = torch.ops.aten
    # Each call returns its output; the engine's and the Triton kernel's write ``out``.
    cands = {"engine varlen (paged cache)": lambda: paged_varlen_attention(
        q, cache, md, scale, out, num_sms=sms) or out}
    cands["torch flash (varlen, strided k/v)"] = lambda: aten._flash_attention_forward(
        q, k, v, cu, cu, t, t, 0.0, True, False, scale=scale)[0]
    cands["cudnn (ragged, gqa)"] = lambda: aten._cudnn_attention_forward(
        qc, kc, vc, None, cu, cu, t, t, False, 0.0, True, False, scale=scale)[0]
    cands["cudnn (ragged, k/v expanded)"] = lambda: aten._cudnn_attention_forward(
        qc, ke, ve, None, cu, cu, t, t, False, 0.0, True, False, scale=scale)[0]
    cands["cudnn sdpa (dense, k/v expanded)"] = lambda: aten._scaled_dot_product_cudnn_attention(
        qc.transpose(0, 1)[None], ke.transpose(0, 1)[None], ve.transpose(0, 1)[None],
        None, False, 0.0, True, False, scale=scale)[0][0].transpose(0, 1)
    cands["cudnn sdpa (dense, gqa, strided views)"] = lambda: (
        aten._scaled_dot_product_cudnn_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            None, False, 0.0, True, False, scale=scale)[0][0].transpose(0, 1))
    cands["cudnn sdpa public (enable_gqa, strided views)"] = lambda: _public_cudnn(q, k, v, scale)
    for bm, bn, w, st in ((128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 4, 3)):
        cands[f"triton tma {bm}x{bn} w{w} s{st}"] = tma_attention(q, k, v, out, scale, bm, bn,
                                                                  w, st)
    print(f"\n== one prompt of {t} tokens: {flops / 1e9:.2f} GFLOP", flush=True)
    for name, call in cands.items():
        if only and not any(o in name for o in only):
            continue
        try:
            out.zero_()
            res = call()
            torch.cuda.synchronize()
            err = (res.float() - ref).abs().max().item()
            us = do_bench(call, warmup=10, rep=50) * 1e3
        except Exception as exc:
            print(f"{name}: failed: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
            continue
        graph = "?"
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                res = call()
            res.zero_()
            g.replay()
            torch.cuda.synchronize()
            graph = "ok" if (res.float() - ref).abs().max().item() <= err + 1e-3 else "WRONG"
        except Exception as exc:
            graph = f"no ({type(exc).__name__})"
        print(f"{us:9.1f} us {flops / us / 1e6:7.1f} TFLOP/s  err {err:.4f}  graph {graph}"
              f"  out strides {tuple(res.stride())}  {name}", flush=True)


def main() -> int:
    import torch

    p = argparse.ArgumentParser()
    p.add_argument("--lens", default="1024,4096")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--only", default="", help="comma-separated parts of the names to time")
    ns = p.parse_args()
    h, hk, d = ns.heads, ns.kv_heads, ns.head_dim
    try:
        lens = [int(x) for x in ns.lens.split(",")]
    except ValueError:
        p.error(f"--lens must be comma-separated integers, got {ns.lens!r}")
    if min(lens) < 1 or min(h, hk, d) < 1 or h % hk or d % 16:
        p.error("--lens, --heads and --kv-heads must be positive, --heads a multiple of "
                "--kv-heads, and --head-dim a positive multiple of 16")
    if not torch.cuda.is_available():
        p.error("needs a CUDA device")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for t in lens:
        time_length(t, h, hk, d, sms, [o for o in ns.only.split(",") if o])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
