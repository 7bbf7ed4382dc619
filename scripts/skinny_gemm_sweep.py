"""Time the skinny GEMM kernel against cuBLAS over configurations (GPU), per decoder shape.

    python scripts/skinny_gemm_sweep.py [--models qwen3-0.6b,llama3-8b] [--rows 1,4,8,16]
        [--calls 200] [--budget-s 200] [--quick]

For each projection shape (N, K) of the models and each row count M, every configuration of the
grid (tiles, warps, stages, K slices sized for 1, 2, 4 and 8 waves over the SMs) is checked
against F.linear once, then timed inside a CUDA graph of back-to-back calls (about ``--calls``
per configuration, so launch overhead is that of a graph, as in a decode step). Each call reads
another copy of the weight, the copies together three times the L2, so that no call finds its
weight in L2 (a decode step streams every weight from HBM). Prints, per shape and M, cuBLAS and
the best configuration in us and weight TB/s, then the per-layer totals, then the table for
``cadence/model/skinny_gemm.py`` (``SKINNY_CONFIGS``) as a Python literal: the best
configuration where it beats cuBLAS by 3% or more, None elsewhere. A configuration that fails to
compile or to match F.linear is skipped with a note. Past ``--budget-s`` seconds the remaining
cases time only cuBLAS, the heuristic and the current table's configuration.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cadence.model.skinny_gemm import SKINNY_CONFIGS, heuristic_config  # noqa: E402
from cadence.model.skinny_gemm_kernels import (  # noqa: E402
    SkinnyConfig,
    launch_shape,
    row_bucket,
    skinny_matmul,
)

MODELS = {  # name -> (layers, {projection: (N, K)})
    "qwen3-0.6b": (28, {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024),
                        "down": (1024, 3072)}),
    "llama3-8b": (32, {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                       "down": (4096, 14336)}),
    # The attention projections only (its MLP is the experts; its router is not a projection).
    "qwen3-30b-a3b": (48, {"qkv": (5120, 2048), "o": (2048, 4096)}),
}  # fmt: skip
# (block_n, block_k), the likelier first: --quick takes the first three of each.
DOT_TILES = [(32, 256), (16, 512), (64, 128), (32, 128), (32, 512), (16, 256), (64, 256),
             (128, 128)]  # fmt: skip
FMA_TILES = [(16, 512), (8, 512), (32, 256), (4, 1024), (8, 1024), (16, 256)]
WAVES = (1, 2, 4, 8)
KEEP_MARGIN = 0.97  # the kernel replaces cuBLAS only when at least 3% faster


def splits(n: int, k: int, block_n: int, block_k: int, sms: int) -> list[int]:
    """K slice counts that give about 1, 2, 4 and 8 programs per SM (distinct, in range)."""
    blocks, tiles = -(-n // block_n), -(-k // block_k)
    found = []
    for waves in WAVES:
        split = max(1, min(tiles, round(waves * sms / blocks)))
        split = launch_shape(1, n, k, SkinnyConfig(block_n, block_k, split)).split_k
        if split not in found:
            found.append(split)
    return found


def grid(rows: int, n: int, k: int, sms: int, quick: bool) -> list[SkinnyConfig]:
    out = []
    for bn, bk in DOT_TILES[:3] if quick else DOT_TILES:
        for warps in (4, 8) if bn >= 64 else (4,):
            for stages in (3,) if quick else (3, 4):
                out += [SkinnyConfig(bn, bk, s, warps, stages, True)
                        for s in splits(n, k, bn, bk, sms)]
    if rows <= 4:
        block_m = 1 if rows == 1 else 4
        for bn, bk in FMA_TILES[:3] if quick else FMA_TILES:
            for warps in (4, 8):
                if block_m * bn * bk // (32 * warps) > 128:
                    continue  # registers: float32 products per thread
                out += [SkinnyConfig(bn, bk, s, warps, 1, False)
                        for s in splits(n, k, bn, bk, sms)]
    return out


def time_calls(calls: list[Callable[[], object]], total: int) -> float:
    """us per call: the calls captured back to back in one CUDA graph, replayed until about
    ``total`` calls ran (after one replay of warm-up)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    replays = max(2, math.ceil(total / len(calls)))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    us = start.elapsed_time(end) * 1e3 / (replays * len(calls))
    del graph
    return us


def weight_copies(n: int, k: int, l2_bytes: int) -> list[torch.Tensor]:
    nbytes = n * k * 2
    count = max(2, math.ceil(3 * l2_bytes / nbytes))
    first = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    return [first] + [first.clone() for _ in range(count - 1)]


def fmt_cfg(cfg: SkinnyConfig | None) -> str:
    if cfg is None:
        return "None"
    return (f"SkinnyConfig({cfg.block_n}, {cfg.block_k}, {cfg.split_k}, {cfg.num_warps}, "
            f"{cfg.num_stages}, {cfg.dot})")


class ContextLost(RuntimeError):
    """A kernel broke the CUDA context: nothing later can run."""


def measure(x: torch.Tensor, copies: list[torch.Tensor], configs: list[SkinnyConfig],
            calls: int) -> tuple[dict[SkinnyConfig, float], int]:
    """us per call of each configuration that runs and matches F.linear; how many were not."""
    ref = F.linear(x, copies[0]).float()
    scale = float(ref.abs().max())
    timings: dict[SkinnyConfig, float] = {}
    skipped = 0
    for cfg in dict.fromkeys(configs):
        try:
            err = float((skinny_matmul(x, copies[0], None, cfg).float() - ref).abs().max())
            if not err <= 0.02 + 0.02 * scale:
                print(f"  skip {fmt_cfg(cfg)}: max error {err:.3g}", flush=True)
                skipped += 1
                continue
            launches = [functools.partial(skinny_matmul, x, w, None, cfg) for w in copies]
            timings[cfg] = time_calls(launches, calls)
        except Exception as exc:  # a configuration that cannot run here
            first = (str(exc).splitlines() or [""])[0][:120]
            print(f"  skip {fmt_cfg(cfg)}: {type(exc).__name__}: {first}", flush=True)
            skipped += 1
            if "CUDA error" in first or "illegal" in first.lower():
                raise ContextLost(first) from exc
    return timings, skipped


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--rows", default="1,4,8,16")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--budget-s", type=float, default=200.0)
    p.add_argument("--quick", action="store_true", help="a third of the grid")
    ns = p.parse_args()
    if not torch.cuda.is_available():
        print("skinny_gemm_sweep.py needs a CUDA device", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    l2 = getattr(props, "L2_cache_size", 50 << 20) or (50 << 20)
    models = ns.models.split(",")
    rows_list = [int(r) for r in ns.rows.split(",")]
    cases = [(m, proj, n, k) for m in models for proj, (n, k) in MODELS[m][1].items()]
    print(f"{props.name}: {sms} SMs, L2 {l2 >> 20} MiB, capability {props.major}.{props.minor}; "
          f"{len(cases)} shapes x {len(rows_list)} row counts", flush=True)
    t0 = time.perf_counter()
    results: dict[tuple[str, str, int], dict] = {}
    table: dict[tuple[int, int, int], tuple[SkinnyConfig | None, float, float]] = {}
    done = 0
    for model, proj, n, k in cases:
        copies = weight_copies(n, k, l2)
        for rows in rows_list:
            done += 1
            started = time.perf_counter()
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            cublas = time_calls([functools.partial(F.linear, x, w) for w in copies], ns.calls)
            bucket = row_bucket(rows)
            heur = heuristic_config(bucket, n, k, sms)
            current = SKINNY_CONFIGS.get((n, k, bucket), heur) or heur
            over = time.perf_counter() - t0 > ns.budget_s
            configs = [heur, current] + ([] if over else grid(rows, n, k, sms, ns.quick))
            try:
                timings, skipped = measure(x, copies, configs, ns.calls)
            except ContextLost:
                print("  the CUDA context is lost: stopping here", flush=True)
                report(results, table, rows_list, models)
                return 1
            best = min(timings, key=timings.__getitem__) if timings else None
            best_us = timings[best] if best else math.inf
            results[(model, proj, rows)] = dict(
                n=n, k=k, nbytes=2 * (n * k + rows * (n + k)), cublas=cublas, best=best,
                best_us=best_us, heur_us=timings.get(heur, math.inf),
            )  # fmt: skip
            if rows == bucket:  # the table is by bucket: 1, 4, 8, 16
                keep = best if best_us < KEEP_MARGIN * cublas else None
                table[(n, k, rows)] = (keep, best_us, cublas)
            print(f"[{done}/{len(cases) * len(rows_list)}] {model} {proj} {n}x{k} M={rows}: "
                  f"{len(timings)} configs timed{f', {skipped} skipped' if skipped else ''}"
                  f"{' (budget spent: heuristic and table only)' if over else ''} in "
                  f"{time.perf_counter() - started:.1f} s; cuBLAS {cublas:.2f} us, best "
                  f"{best_us:.2f} us", flush=True)
        del copies
        torch.cuda.empty_cache()
    print(f"sweep took {time.perf_counter() - t0:.0f} s", flush=True)
    report(results, table, rows_list, models)
    return 0


def _chosen_us(r: dict) -> float:
    return r["best_us"] if r["best_us"] < KEEP_MARGIN * r["cublas"] else r["cublas"]


def report(results: dict, table: dict, rows_list: list[int], models: list[str]) -> None:
    print(f"\n{'shape':<30}{'M':>3} {'cuBLAS us':>9}{'TB/s':>6} {'best us':>8}{'TB/s':>6}"
          f"{'speedup':>8} {'heur us':>8}  best config")
    for (model, proj, rows), r in results.items():
        gb = r["nbytes"] / 1e6
        best_tb = gb / r["best_us"] if math.isfinite(r["best_us"]) else 0.0
        shape = f"{model} {proj} {r['n']}x{r['k']}"
        print(f"{shape:<30}{rows:>3} {r['cublas']:>9.2f}{gb / r['cublas']:>6.2f}"
              f" {r['best_us']:>8.2f}{best_tb:>6.2f}{r['cublas'] / r['best_us']:>7.2f}x"
              f" {r['heur_us']:>8.2f}  {fmt_cfg(r['best'])}")
    print("\nper layer (all four projections), us: cuBLAS -> chosen (the kernel where it wins)")
    for model in models:
        layers, projs = MODELS[model]
        for rows in rows_list:
            keys = [(model, proj, rows) for proj in projs]
            if not all(key in results for key in keys):
                continue
            base = sum(results[key]["cublas"] for key in keys)
            chosen = sum(_chosen_us(results[key]) for key in keys)
            print(f"  {model} M={rows}: {base:.1f} -> {chosen:.1f} us per layer; "
                  f"{layers} layers: {base * layers:.0f} -> {chosen * layers:.0f} us per step")
    print("\n# (N, K, row bucket) -> SkinnyConfig(block_n, block_k, split_k, num_warps, "
          "num_stages, dot)")
    print("SKINNY_CONFIGS: dict[tuple[int, int, int], SkinnyConfig | None] = {")
    for (n, k, rows), (cfg, best_us, cublas) in sorted(table.items()):
        print(f"    ({n}, {k}, {rows}): {fmt_cfg(cfg)},  # {best_us:.2f} vs cuBLAS {cublas:.2f} us")
    print("}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
