"""FP8 GEMMs of few rows on the GPU: bf16 cuBLAS against the FP8 weight-only Triton kernel
(a grid of tiles) and per-token quantization + ``torch._scaled_mm``, per decoder shape.

Each variant runs inside a CUDA graph of ``--replays`` launches, cycling through enough copies of
the weights that they do not sit in L2; the figure is microseconds per GEMM and the weight
bandwidth it reaches. Prints a table, then the best tile per shape as a Python dict.

    python scripts/fp8_sweep.py [--rows 1,8,16] [--models llama3-8b,qwen3-0.6b]
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.nn.functional as F

from cadence.model.fp8 import quantize_rows
from cadence.model.fp8_kernels import WeightOnlyConfig, quantize_tokens, weight_only_linear

SHAPES = {  # (N, K) of qkv, o, gate_up, down
    "llama3-8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
    "qwen3-0.6b": [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)],
}
L2_BYTES = 50 * 2**20


def timed(fn, replays: int) -> float:
    """Microseconds per call of ``fn`` inside a CUDA graph of ``replays`` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(replays):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / replays)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--models", default="llama3-8b,qwen3-0.6b")
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--gemv-only", action="store_true",
                    help="time only the one-row CUDA-core kernel (and bf16) against each other")
    ap.add_argument("--f16", action="store_true",
                    help="time tiles with f16 products against the tables' choice of today")
    ap.add_argument("--table-only", action="store_true",
                    help="time only the tables' choice per shape (and bf16 cuBLAS)")
    args = ap.parse_args()
    grid = [WeightOnlyConfig(bn, bk, w, s, sk) for bn, bk, w, s, sk in itertools.product(
        (32, 64), (256, 512), (4, 8), (3, 4), (1, 2, 4, 8))]
    gemv = [WeightOnlyConfig(bn, bk, w, 3, sk, True)
            for (bn, bk, w), sk in itertools.product(
                ((16, 512, 4), (32, 512, 8), (16, 1024, 8), (32, 256, 4), (64, 256, 8)),
                (1, 2, 4, 8))]
    if args.gemv_only:
        grid = []
    if args.f16:
        grid = [WeightOnlyConfig(bn, bk, w, s, sk, f16=True)
                for bn, bk, w, s, sk in itertools.product(
                    (32, 64, 128), (128, 256, 512), (4, 8), (3,), (1, 2, 4, 8))]
        gemv = []
    if args.table_only:
        grid, gemv = [None], []
    best_cfg: dict[tuple[int, int], WeightOnlyConfig] = {}
    print(f"{'model':<11} {'N x K':>12} {'M':>3} {'bf16 us':>8} {'TB/s':>5} {'fp8 wo us':>9} "
          f"{'TB/s':>5} {'scaled_mm us':>12} best tile", flush=True)
    for model in args.models.split(","):
        for n, k in SHAPES[model]:
            copies = max(2, -(-2 * L2_BYTES // (n * k * 2)))
            w16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
                   for _ in range(copies)]
            w8 = [quantize_rows(w) for w in w16]
            for m in map(int, args.rows.split(",")):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                bf16 = timed(lambda i, x=x, w=w16: F.linear(x, w[i % len(w)]), args.replays)
                scores: list[tuple[float, WeightOnlyConfig]] = []
                for cfg in grid + (gemv if m == 1 else []):
                    try:
                        us = timed(lambda i, x=x, cfg=cfg, w=w8: weight_only_linear(
                            x, w[i % len(w)][0], w[i % len(w)][1], cfg), args.replays)
                    except Exception as exc:  # a tile that does not compile or fit: skipped
                        print(f"  skip {cfg}: {type(exc).__name__}", file=sys.stderr)
                        continue
                    scores.append((us, cfg))
                us, cfg = min(scores, key=lambda t: t[0])
                if args.f16:
                    today = timed(lambda i, x=x, w=w8: weight_only_linear(
                        x, w[i % len(w)][0], w[i % len(w)][1]), args.replays)
                    print(f"  today's table: {today:.2f} us ({n * k / today / 1e6:.2f} TB/s)",
                          flush=True)
                if m == 1 and cfg is not None:
                    best_cfg[(n, k)] = cfg

                def scaled(i, x=x, w=w8):
                    xq, xs = quantize_tokens(x)
                    wq, ws = w[i % len(w)]
                    return torch._scaled_mm(xq, wq.t(), scale_a=xs.view(-1, 1),
                                            scale_b=ws.view(1, -1), out_dtype=torch.bfloat16)

                try:
                    mm = f"{timed(scaled, args.replays):12.2f}"
                except Exception as exc:
                    mm = f"{type(exc).__name__:>12}"
                tile = "the tables' choice" if cfg is None else (
                    f"{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages} "
                    f"split{cfg.split_k}{' gemv' if cfg.gemv else ''}{' f16' if cfg.f16 else ''}")
                print(f"{model:<11} {n:>5} x {k:<5} {m:>3} {bf16:8.2f} "
                      f"{n * k * 2 / bf16 / 1e6:5.2f} {us:9.2f} {n * k / us / 1e6:5.2f} {mm} "
                      f"{tile}", flush=True)
    print("WEIGHT_ONLY_CONFIGS = {")
    for (n, k), c in best_cfg.items():
        print(f"    ({n}, {k}): WeightOnlyConfig({c.block_n}, {c.block_k}, {c.num_warps}, "
              f"{c.num_stages}, {c.split_k}{', True' if c.gemv else ''}"
              f"{', f16=True' if c.f16 else ''}),")
    print("}")


if __name__ == "__main__":
    main()
