"""Dense causal prefill attention: cuDNN's call against a Triton kernel's tiles (GPU question
for issue 9's 1,024-token TTFT).

cuDNN runs a 1,024-token causal pass of Qwen3-0.6B's heads at ~180 TFLOP/s (docs/perf.md, run
BV): its 128-query tiles make one wave whose longest chain (the last tile, every key) sets the
time. A shorter query block halves that chain; packing the query heads that share a kv head
into one program's rows reads each key tile once for both. The programs run heaviest first
across all heads (the query block is the grid's slow axis, taken from the end).

Times each variant's calls for ``--layers`` layers replayed in one CUDA graph (each layer its
own buffers), us a layer (p50 of ``--replays``), and its largest difference from a float32
reference of the first layer.

    python3 scripts/causal_tile_sweep.py --lens 1024,2048,4096 [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadence.model.dense_prefill import DensePrefill  # noqa: E402


def causal_packed(q, k, v, out, scale, block_m=64, pack=1, block_n=64, num_warps=4,
                  num_stages=3, sms=0):
    """The engine's kernel (``cadence.model.causal_attention``) at the given tile; ``sms`` > 0:
    the balanced order."""
    from cadence.model.causal_attention import CausalTile, causal_attention

    tile = CausalTile(block_m, pack, block_n, num_warps, num_stages, balanced=sms > 0)
    return causal_attention(q, k, v, out, scale, num_sms=sms, tile=tile)


def reference(q, k, v, scale):
    g = q.shape[1] // k.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1), k.float().repeat_interleave(g, 1).transpose(0, 1),
        v.float().repeat_interleave(g, 1).transpose(0, 1), is_causal=True, scale=scale,
    ).transpose(0, 1)  # fmt: skip


def configs(quick: bool):
    """(block_m, pack, block_n, warps, stages) to try."""
    shapes = [(64, 1), (32, 2), (128, 1), (64, 2)]
    if quick:
        return [(64, 1, 64, 4, 2), (32, 2, 64, 4, 2), (128, 1, 64, 8, 2), (64, 2, 64, 8, 2)]
    out = []
    for (bm, pack), bn, warps, stages in itertools.product(shapes, (32, 64, 128), (4, 8), (2, 3)):
        if bm % bn == 0 and not (pack * bm >= 128 and warps == 4 and bn == 128):
            out.append((bm, pack, bn, warps, stages))
    return out


def varlen_variant(t, h, hk, d):
    """The engine's paged varlen kernel over one fresh sequence whose keys are in a cache."""
    from cadence.model.triton_attention import paged_varlen_attention, store_kv_cache
    from scripts.attention_sweep import make

    _, cache, md, _ = make([(t, t)], h, hk, d)
    md.slot_mapping.copy_(torch.arange(16, 16 + t, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def call(q, k, v, o):
        store_kv_cache(k, v, cache, md.slot_mapping)
        paged_varlen_attention(q, cache, md, d**-0.5, o, num_sms=sms)
        return o

    return call


def label(c) -> str:
    return "triton m{} pack{} n{} w{} s{}".format(*c) + (" bal" if len(c) > 5 and c[5] else "")


def time_graph(fn, layers, replays):
    for _ in range(2):
        for lay in layers:
            fn(*lay)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for lay in layers:
            fn(*lay)
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    times = []
    for _ in range(replays):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / len(layers))
    times.sort()
    return times[len(times) // 2], times[0]


def shape_args(p: argparse.ArgumentParser) -> None:
    """The prompt lengths, layer count, head shape and replays of a causal attention timing."""
    p.add_argument("--lens", default="1024,2048,4096")
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--replays", type=int, default=20)


def main() -> None:
    p = argparse.ArgumentParser()
    shape_args(p)
    p.add_argument("--quick", action="store_true", help="four configurations only")
    p.add_argument("--configs", default="",
                   help="configurations to time, e.g. 64x1x64x4x3,32x1x32x4x3x132 (block_m x pack "
                   "x block_n x warps x stages [x SMs: balanced order]); default: the sweep")
    p.add_argument("--varlen", action="store_true",
                   help="also the engine's paged varlen kernel (keys from the cache)")
    p.add_argument("--best", type=int, default=6,
                   help="after the first length, time only this many best configurations")
    args = p.parse_args()
    torch.manual_seed(0)
    h, hk, d = args.heads, args.kv_heads, args.head_dim
    scale = d**-0.5
    cands = configs(args.quick)
    if args.configs:
        cands = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
        args.best = len(cands)
    cudnn = DensePrefill(use_triton=False)  # the engine's cuDNN call
    for i, t in enumerate(int(x) for x in args.lens.split(",")):
        layers = []
        for _ in range(args.layers):
            qkv = torch.randn(t, (h + 2 * hk) * d, device="cuda", dtype=torch.bfloat16)
            q, k, v = qkv.split([h * d, hk * d, hk * d], dim=-1)
            out = torch.empty(t, h, d, device="cuda", dtype=torch.bfloat16)
            layers.append((q.view(t, h, d), k.view(t, hk, d), v.view(t, hk, d), out))
        ref = reference(*layers[0][:3], scale)
        flops = 4 * h * d * t * (t + 1) / 2
        variants = {"cudnn whole": lambda q, k, v, o: cudnn.attend(q, k, v, scale)}
        if args.varlen:
            variants["engine varlen"] = varlen_variant(t, h, hk, d)
        for c in cands:
            variants[label(c)] = (
                lambda q, k, v, o, c=c: causal_packed(q, k, v, o, scale, *c))
        results = []
        for name, fn in variants.items():
            try:
                err = (fn(*layers[0]).float() - ref).abs().max().item()
                p50, low = time_graph(fn, layers, args.replays)
            except Exception as exc:  # noqa: BLE001 - a scratch measurement: report, go on
                print(f"T={t:5d} {name:30s} failed: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:160]}", flush=True)
                continue
            results.append((p50, name))
            print(f"T={t:5d} {name:30s} p50 {p50:8.2f} us a layer (min {low:8.2f}) "
                  f"{flops / p50 / 1e6:6.1f} TFLOP/s  max |err| {err:.3g}", flush=True)
        best = sorted(r for r in results if r[1] != "cudnn whole")[: args.best]
        print(f"T={t:5d} best: " + "; ".join(f"{n} {v:.2f}" for v, n in best), flush=True)
        if i == 0:
            keep = {n for _, n in best}
            cands = [c for c in cands if label(c) in keep]


if __name__ == "__main__":
    main()
