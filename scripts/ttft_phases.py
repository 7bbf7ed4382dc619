"""Host time of each engine phase on the way to a prompt's first token (no profiler).

    python scripts/ttft_phases.py --model qwen3-0.6b --load-format dummy [--input-len 1024]
        [--repeats 20]

Times one request at a time (``bench ttft``'s ``time_one``: a fresh prompt, ``max_tokens=1``)
with each phase's call wrapped in a timer, and prints the time to first token and every
phase's p50 and maximum in microseconds: what the host does before the first kernel runs
(``add_request``, ``schedule``, ``apply``, ``prepare``, ``upload``, the graph launch) and
what overlaps the GPU (``sampling.metadata``). Before that, the host cost of one graph replay
per captured size it can reach (launch only, the GPU idle).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _timed(obj: Any, name: str, label: str, acc: dict[str, list[float]]) -> None:
    """Replace ``obj.name`` with a wrapper that appends each call's seconds to ``acc[label]``."""
    fn: Callable[..., Any] = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[label].append(time.perf_counter() - start)

    setattr(obj, name, wrapper)


def _row(label: str, seconds: list[float]) -> str:
    s = sorted(seconds)
    return f"{label:20s} n={len(s):4d}  p50 {s[len(s) // 2] * 1e6:9.1f} us  max {s[-1] * 1e6:9.1f}"


def main() -> int:
    from cadence.bench.common import random_prompts
    from cadence.bench.ttft import time_one
    from cadence.engine.core import EngineCore
    from cadence.engine.engine_args import EngineArgs

    p = argparse.ArgumentParser()
    EngineArgs.add_cli_args(p)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=20)
    ns = p.parse_args()
    if ns.input_len < 1 or ns.repeats < 1:
        p.error(f"--input-len and --repeats must be at least 1, got {ns.input_len} and "
                f"{ns.repeats}")
    args = EngineArgs.from_cli_args(ns)
    args.skip_tokenizer_init = True
    args.max_num_seqs = min(args.max_num_seqs, 8)  # as bench ttft runs
    args.max_model_len = args.max_model_len or ns.input_len + 16
    args.max_num_batched_tokens = args.max_num_batched_tokens or max(8192, ns.input_len)
    core = EngineCore(args)
    runner = core.runner
    prompts = random_prompts(ns.repeats + 4, ns.input_len, core.vocab_size, seed=5)
    for i in range(4):
        time_one(core, prompts[i], f"warm-{i}")
    for label, graphs in (("mixed", runner.mixed_graphs), ("decode", runner.graphs)):
        if graphs is None:
            continue
        for size in (graphs.sizes[0], graphs.sizes[-1]):
            launches = []
            for _ in range(12):
                runner.main.synchronize()
                start = time.perf_counter()
                graphs.replay(size)
                launches.append(time.perf_counter() - start)
            runner.main.synchronize()
            print(_row(f"replay {label} {size}", launches))
    acc: dict[str, list[float]] = defaultdict(list)
    _timed(core, "add_request", "add_request", acc)
    _timed(core.scheduler, "schedule", "schedule", acc)
    _timed(runner.input_batch, "apply", "apply", acc)
    _timed(runner.input_batch, "prepare", "prepare", acc)
    _timed(runner.buffers, "upload", "upload", acc)
    if runner.mixed_graphs is not None:
        _timed(runner.mixed_graphs, "replay", "mixed replay", acc)
    _timed(runner.sampling, "metadata", "sampling.metadata", acc)
    ttft = [time_one(core, prompts[4 + i], f"t-{i}") for i in range(ns.repeats)]
    print(_row("TTFT", ttft))
    for label, seconds in acc.items():
        print(_row(label, seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
