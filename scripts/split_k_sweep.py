"""Time K-split projections (model/split_k.py) against cuBLAS's whole product (GPU).

    python scripts/split_k_sweep.py [--models qwen3-0.6b] [--rows 8,32,64,128,256,1024]
        [--parts 2,3,4,6,8,12,16] [--calls 2000]

For each projection shape (N, K) of the models and each row count, ``F.linear`` and
``split_k_linear`` at every split count that divides K are timed inside a CUDA graph of
back-to-back calls, each call on another copy of the weight (the copies three times the L2, as a
decode step streams every weight from HBM). Prints us per call for cuBLAS, each split count and
the best, then the ranges for ``SPLIT_K_TABLE``: per shape, the best split count at each row count
where it beats cuBLAS by 5% or more (the norm that adds the partial sums up costs a little more
than the one it replaces).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from skinny_gemm_sweep import MODELS, time_calls, weight_copies  # noqa: E402

from cadence.cli_types import int_list_at_least  # noqa: E402
from cadence.model.split_k import split_k_linear  # noqa: E402


def sweep(n: int, k: int, rows: int, parts_list: list[int], total: int) -> dict[int, float]:
    """us per call by split count (0: cuBLAS's whole product)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    weights = weight_copies(n, k, l2)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    times = {0: time_calls([functools.partial(F.linear, x, w) for w in weights], total)}
    for parts in parts_list:
        if k % parts or (k // parts) % 8:
            continue
        times[parts] = time_calls([functools.partial(split_k_linear, x, w, parts)
                                   for w in weights], total)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen3-0.6b")
    parser.add_argument("--rows", type=int_list_at_least(1), default=[8, 32, 64, 128, 256, 1024])
    parser.add_argument("--parts", type=int_list_at_least(2), default=[2, 3, 4, 6, 8, 12, 16])
    parser.add_argument("--calls", type=int_list_at_least(1), default=[2000],
                        help="calls timed per case (one value)")
    ns = parser.parse_args()
    if not torch.cuda.is_available():
        print("split_k_sweep.py needs a CUDA device", file=sys.stderr)
        return 2
    table: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for model in ns.models.split(","):
        for name, (n, k) in MODELS[model][1].items():
            for rows in ns.rows:
                times = sweep(n, k, rows, ns.parts, ns.calls[0])
                best = min((p for p in times if p), key=times.get, default=0)
                cells = "  ".join(f"{p}:{us:.2f}" for p, us in times.items() if p)
                print(f"{model} {name:8s} {n}x{k} rows {rows:5d}  cuBLAS {times[0]:7.2f}  "
                      f"{cells}  best {best}", flush=True)
                if best and times[best] <= 0.95 * times[0]:
                    table.setdefault((n, k), []).append((rows, best))
    print("\nSPLIT_K_TABLE candidates (rows measured, best split count):")
    for (n, k), ranges in table.items():
        print(f"    ({n}, {k}): {tuple(ranges)},")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
