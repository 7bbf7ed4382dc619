"""The prefill's elementwise launches (residual add + RMSNorm, q/k norm + RoPE + K/V store,
SwiGLU) at prompt-sized row counts, each timed inside a CUDA graph against launch variants
(rows per program, heads per program, warps) and against a plain streaming kernel that moves
the same bytes (the floor a kernel of that traffic can reach).

    python3 scripts/prefill_elementwise_bench.py --rows 1024,4096

Shapes default to Qwen3-0.6B's (hidden 1024, 16 q heads and 8 kv heads of 128, intermediate
3072). Prints us a call for each variant; the engine's launch is marked ``*``.
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import triton
import triton.language as tl

from cadence.model import fused_ops
from cadence.model.rms_norm_kernels import inverse_rms, normalize, residual_sum
from cadence.runtime.triton_launch import next_pow2


@triton.jit
def _stream_kernel(a_ptr, b_ptr, c_ptr, d_ptr, n, BLOCK: tl.constexpr):
    # Reads a and b, writes c and d: the traffic of an add + norm with its new residual.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(a_ptr + offs, mask=m, other=0.0)
    b = tl.load(b_ptr + offs, mask=m, other=0.0)
    tl.store(c_ptr + offs, a + b, mask=m)
    if d_ptr is not None:
        tl.store(d_ptr + offs, a * b, mask=m)


@triton.jit
def _rows_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, res_ptr, rows, eps, N: tl.constexpr,
                      ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # ROWS rows a program, the row whole in registers (one read of x and r).
    offs_m = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offs = tl.arange(0, BLOCK)
    mask = (offs_m[:, None] < rows) & (offs[None, :] < N)
    idx = offs_m[:, None].to(tl.int64) * N + offs[None, :]
    dt = res_ptr.dtype.element_ty
    x = residual_sum(tl.load(x_ptr + idx, mask=mask, other=0.0),
                     tl.load(r_ptr + idx, mask=mask, other=0.0), dt)
    tl.store(res_ptr + idx, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = inverse_rms(tl.sum(xf * xf, axis=1), N, eps)
    w = tl.load(w_ptr + offs, mask=offs < N, other=0.0)
    tl.store(out_ptr + idx, normalize(x, rstd, w, dt).to(dt), mask=mask)


@triton.jit
def _rows_silu_kernel(x_ptr, out_ptr, rows, D: tl.constexpr, ROWS: tl.constexpr,
                      BLOCK: tl.constexpr):
    offs_m = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (offs_m[:, None] < rows) & (offs[None, :] < D)
    base = offs_m[:, None].to(tl.int64) * (2 * D) + offs[None, :]
    gate = tl.load(x_ptr + base, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + base + D, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty).to(tl.float32)
    o = offs_m[:, None].to(tl.int64) * D + offs[None, :]
    tl.store(out_ptr + o, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def graph_us(fn, calls: int = 20, replays: int = 30) -> float:
    """us a call of ``fn`` replayed ``calls`` times back to back inside one CUDA graph."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for _ in range(calls):
                fn()
    torch.cuda.synchronize()
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(replays):
            g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (calls * replays))
    return sorted(times)[len(times) // 2]


def bench_norm(rows: int, hidden: int) -> None:
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(rows, hidden, device=dev, dtype=dt)
    r = torch.randn(rows, hidden, device=dev, dtype=dt)
    w = torch.rand(hidden, device=dev, dtype=dt)
    out, res = torch.empty_like(x), torch.empty_like(x)
    n = x.numel()
    mb = 4 * n * 2 / 1e6
    print(f"\nadd + RMSNorm, {rows} x {hidden} ({mb:.1f} MB moved)")
    print(f"  * engine's launch            {graph_us(lambda: fused_ops.add_rms_norm(x, r, w, 1e-6)):7.2f}")
    for block in (1024, 2048, 4096):
        t = graph_us(partial(_stream_kernel[(triton.cdiv(n, block),)], x, r, out, res, n,
                             BLOCK=block, num_warps=4))
        print(f"  stream floor, block {block:5d}    {t:7.2f}")
    for nrows in (1, 2, 4, 8):
        for warps in (1, 2, 4, 8):
            if nrows * hidden // (32 * warps) > 256:
                continue
            t = graph_us(partial(_rows_norm_kernel[(triton.cdiv(rows, nrows),)],
                x, r, w, out, res, rows, 1e-6, N=hidden, ROWS=nrows, BLOCK=next_pow2(hidden),
                num_warps=warps))
            print(f"  {nrows} rows a program, {warps} warps {t:7.2f}")


def bench_rope(rows: int, heads: int, kv_heads: int, head_dim: int) -> None:
    dev, dt = "cuda", torch.bfloat16
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim, device=dev, dtype=dt)
    q = qkv[:, : heads * head_dim].view(rows, heads, head_dim)
    k = qkv[:, heads * head_dim: (heads + kv_heads) * head_dim].view(rows, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim:].view(rows, kv_heads, head_dim)
    pos = torch.arange(rows, device=dev)
    cs = torch.randn(rows, head_dim, device=dev, dtype=dt)
    qw = torch.rand(head_dim, device=dev, dtype=dt)
    kw = torch.rand(head_dim, device=dev, dtype=dt)
    page = 16
    cache = torch.zeros(2, rows // page + 1, page, kv_heads, head_dim, device=dev, dtype=dt)
    slots = torch.randperm(rows, device=dev)
    store = fused_ops.KVStore(v, cache, slots)
    mb = (qkv.numel() + q.numel() + 3 * k.numel()) * 2 / 1e6
    print(f"\nq/k norm + RoPE + K/V store, {rows} tokens ({mb:.1f} MB moved)")
    t = graph_us(lambda: fused_ops.qk_norm_rope_triton(q, k, pos, cs, qw, kw, 1e-6, store))
    print(f"  * engine's launch            {t:7.2f}")
    n = qkv.numel()
    a = torch.empty(n, device=dev, dtype=dt)
    for block in (1024, 4096):
        # Reads qkv once and writes as many bytes (the launch stores a little more).
        t = graph_us(partial(_stream_kernel[(triton.cdiv(n, block),)],
                             qkv.view(-1), qkv.view(-1), a, None, n, BLOCK=block, num_warps=4))
        print(f"  stream floor, block {block:5d}    {t:7.2f}")
    total = heads + kv_heads
    q_out = torch.empty(q.shape, device=dev, dtype=dt)
    k_out = torch.empty(k.shape, device=dev, dtype=dt)
    block = next_pow2(head_dim // 2)
    for block_h in (4, 8, 16, 32):
        for warps in (1, 2, 4, 8):
            if block_h * block // (32 * warps) < 1:
                continue
            args = (q, k, q_out, k_out, qw, kw, pos, cs, q.stride(0), q.stride(1), k.stride(0),
                    k.stride(1), q_out.stride(0), q_out.stride(1), k_out.stride(0),
                    k_out.stride(1), cs.stride(0), 1e-6, v, cache, slots, v.stride(0),
                    v.stride(1), *cache.stride()[:4])
            grid = (rows, triton.cdiv(total, block_h))
            t = graph_us(partial(fused_ops._qk_norm_rope_kernel[grid],
                *args, NUM_Q_HEADS=heads, NUM_HEADS=total, HEAD_DIM=head_dim, HAS_NORM=True,
                BLOCK=block, BLOCK_H=block_h, STORE=True, PAGE=page, num_warps=warps))
            print(f"  {block_h:2d} heads a program, {warps} warps {t:7.2f}")


def bench_silu(rows: int, inter: int) -> None:
    dev, dt = "cuda", torch.bfloat16
    gu = torch.randn(rows, 2 * inter, device=dev, dtype=dt)
    out = torch.empty(rows, inter, device=dev, dtype=dt)
    mb = gu.numel() * 3 / 2 * 2 / 1e6
    print(f"\nSwiGLU, {rows} x {inter} ({mb:.1f} MB moved)")
    print(f"  * engine's launch            {graph_us(lambda: fused_ops.silu_and_mul(gu)):7.2f}")
    for nrows in (1, 2, 4):
        for block in (512, 1024, 2048, 4096):
            if block > next_pow2(inter):
                continue
            for warps in (2, 4, 8):
                grid = (triton.cdiv(rows, nrows), triton.cdiv(inter, block))
                t = graph_us(partial(_rows_silu_kernel[grid],
                    gu, out, rows, D=inter, ROWS=nrows, BLOCK=block, num_warps=warps))
                print(f"  {nrows} rows, block {block:4d}, {warps} warps {t:7.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1024,4096")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=3072)
    a = p.parse_args()
    print(torch.cuda.get_device_name(), "us a call inside a CUDA graph (20 back to back)")
    for rows in (int(r) for r in a.rows.split(",")):
        bench_norm(rows, a.hidden)
        bench_rope(rows, a.heads, a.kv_heads, a.head_dim)
        bench_silu(rows, a.intermediate)


if __name__ == "__main__":
    main()
