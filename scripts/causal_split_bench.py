"""Dense causal prefill attention, whole against split in halves (H200 question for issue 9).

One causal pass of T tokens gives its last 128-query tile T/128 key tiles and its first one:
at 1024 tokens the grid is one wave over the SMs and the last tiles set its time. Split in
halves, the same work is (1) both diagonal halves causally as a batch of two and (2) the second
half's queries against the first half's keys, unmasked, beside it on a second stream; then the
second half's two partial outputs are merged by their log-sum-exps. The longest tile chain
halves; the merge and the second call are the price. Times the calls of ``--layers`` layers
replayed in one CUDA graph (each layer its own buffers, so nothing stays in L2), us a layer,
and each variant's largest difference from the whole call.

    python3 scripts/causal_split_bench.py --lens 1024,2048,4096
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.causal_tile_sweep import shape_args, time_graph  # noqa: E402


@triton.jit
def _merge_kernel(a_ptr, la_ptr, b_ptr, lb_ptr, out_ptr, half, sa_b, sa_h, sa_t, sla_b, sla_h,
                  sb_h, sb_t, slb_h, H: tl.constexpr, D: tl.constexpr):
    # Token t of the second half: its diagonal part (a, batch 1) and its part against the first
    # half (b), weighted by exp(lse - max); a first-half token copies its diagonal part.
    t = tl.program_id(0)
    offs_h = tl.arange(0, H)
    offs_d = tl.arange(0, D)
    second = t >= half
    i = tl.where(second, t - half, t)
    bi = second.to(tl.int64)
    a = tl.load(a_ptr + bi * sa_b + offs_h[:, None] * sa_h + i * sa_t + offs_d[None, :])
    la = tl.load(la_ptr + bi * sla_b + offs_h * sla_h + i)
    lb = tl.load(lb_ptr + offs_h * slb_h + i, mask=offs_h < H * second.to(tl.int32),
                 other=float("-inf"))
    b = tl.load(b_ptr + offs_h[:, None] * sb_h + i * sb_t + offs_d[None, :],
                mask=(offs_h[:, None] < H * second.to(tl.int32)), other=0.0)
    m = tl.maximum(la, lb)
    wa = tl.exp(la - m)
    wb = tl.exp(lb - m)
    out = (a.to(tl.float32) * wa[:, None] + b.to(tl.float32) * wb[:, None]) / (wa + wb)[:, None]
    tl.store(out_ptr + t * H * D + offs_h[:, None] * D + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty))


def heads(x: torch.Tensor, batch: int) -> torch.Tensor:
    """[T, H, D] tokens as ``batch`` sequences [batch, H, T / batch, D] (a view)."""
    t, h, d = x.shape
    return x.view(batch, t // batch, h, d).permute(0, 2, 1, 3)


def whole(q, k, v, scale):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(
            heads(q, 1), heads(k, 1), heads(v, 1), is_causal=True, scale=scale,
            enable_gqa=True)
    return out[0].transpose(0, 1)


def cudnn_lse(q, k, v, causal, scale):
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]
    return out, lse.reshape(out.shape[0], out.shape[1], out.shape[2])


def split(q, k, v, scale, side: torch.cuda.Stream | None, b_first: bool):
    t = q.shape[0]
    half = t // 2
    main = torch.cuda.current_stream()

    def diag():
        return cudnn_lse(heads(q, 2), heads(k, 2), heads(v, 2), True, scale)

    def cross():
        return cudnn_lse(heads(q[half:], 1), heads(k[:half], 1), heads(v[:half], 1), False,
                         scale)

    if side is None and b_first:
        b, lb = cross()
        a, la = diag()
    elif side is None:
        a, la = diag()
        b, lb = cross()
    else:
        side.wait_stream(main)
        with torch.cuda.stream(side):
            b, lb = cross()
        a, la = diag()
        main.wait_stream(side)
    out = torch.empty_like(q)
    h, d = q.shape[1], q.shape[2]
    _merge_kernel[(t,)](a, la, b, lb, out, half, a.stride(0), a.stride(1), a.stride(2),
                        la.stride(0), la.stride(1), b.stride(1), b.stride(2), lb.stride(1),
                        H=h, D=d, num_warps=4)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    shape_args(p)
    args = p.parse_args()
    torch.manual_seed(0)
    h, hk, d = args.heads, args.kv_heads, args.head_dim
    scale = d**-0.5
    side = torch.cuda.Stream()
    for t in (int(x) for x in args.lens.split(",")):
        layers = []
        for _ in range(args.layers):
            qkv = torch.randn(t, (h + 2 * hk) * d, device="cuda", dtype=torch.bfloat16)
            q, k, v = qkv.split([h * d, hk * d, hk * d], dim=-1)
            layers.append((q.view(t, h, d), k.view(t, hk, d), v.view(t, hk, d)))
        variants = {
            "whole (today)": lambda q, k, v: whole(q, k, v, scale),
            "halves, one stream": lambda q, k, v: split(q, k, v, scale, None, False),
            "halves, cross first": lambda q, k, v: split(q, k, v, scale, None, True),
            "halves, two streams": lambda q, k, v: split(q, k, v, scale, side, False),
        }
        ref = whole(*layers[0], scale).float()
        for name, fn in variants.items():
            try:
                err = (fn(*layers[0]).float() - ref).abs().max().item()
                p50, low = time_graph(fn, layers, args.replays)
                print(f"T={t:5d} {name:22s} p50 {p50:8.2f} us a layer "
                      f"(min {low:8.2f})  max |diff| {err:.3g}", flush=True)
            except Exception as exc:  # noqa: BLE001 - a scratch measurement: report, go on
                print(f"T={t:5d} {name:22s} failed: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:200]}", flush=True)


if __name__ == "__main__":
    main()
