"""Time the sampler's two top-k/top-p paths on the current device.

    python scripts/sampler_bench.py [--vocab 151936] [--rows 1,32,256] [--top-k 50] [--old MODULE]

For each row count: the candidate path (``sample_from_top_k``) and the full sort
(``apply_top_k_top_p`` + ``exponential_race``), top-k only, with top-p 0.9, and seeded (every row
with its own generator); bf16 logits rounded as a model's are. ``--old`` times another version of
the module that holds these functions (a file path: ``cadence/worker/top_k_top_p.py``, or
``cadence/worker/sampler.py`` of a commit before they moved there) beside this one. CUDA events,
median of 20 after 5 warm-ups.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _load(path: str):
    spec = importlib.util.spec_from_file_location("sampler_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _time(fn, reps: int = 20) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _candidates(mod, logits, top_k, kmax, top_p, gens) -> None:
    mod.sample_from_top_k(logits.clone(), top_k, kmax, top_p, gens)


def _full_sort(mod, logits, top_k, top_p, gens) -> None:
    masked = mod.apply_top_k_top_p(logits.clone(), top_k, top_p)
    mod.exponential_race(masked.softmax(dim=-1), gens)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--rows", default="1,32,256")
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--old", default=None)
    ns = p.parse_args()
    if not torch.cuda.is_available():
        p.error("times CUDA kernels with CUDA events: needs a CUDA device")
    from cadence.worker import top_k_top_p as new

    versions = {"new": new}
    if ns.old:
        versions["old"] = _load(ns.old)
    dev = "cuda"
    print("| rows | case | " + " | ".join(f"{v} candidates" for v in versions)
          + " | full sort |")
    print("| ---: | --- |" + " ---: |" * (len(versions) + 1))
    for rows in (int(r) for r in ns.rows.split(",")):
        logits = (torch.randn(rows, ns.vocab, device=dev) * 3).to(torch.bfloat16).float()
        top_k = torch.full((rows,), ns.top_k, dtype=torch.int64, device=dev)
        for case in ("top-k", "top-k + top-p 0.9", "seeded top-k + top-p"):
            top_p = None if case == "top-k" else torch.full((rows,), 0.9, device=dev)
            gens = {}
            if case.startswith("seeded"):
                gens = {i: torch.Generator(device=dev).manual_seed(i) for i in range(rows)}
            cells = [_time(partial(_candidates, m, logits, top_k, ns.top_k, top_p, gens))
                     for m in versions.values()]
            cells.append(_time(partial(_full_sort, new, logits, top_k, top_p, gens)))
            print(f"| {rows} | {case} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
