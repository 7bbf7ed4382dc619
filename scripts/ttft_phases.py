"""Host time of each engine phase on the way to a prompt's first token (no profiler).

    python scripts/ttft_phases.py --model qwen3-0.6b --load-format dummy [--input-len 1024]
        [--repeats 20]

Times one request at a time (``bench ttft``'s ``time_one``: a fresh prompt, ``max_tokens=1``)
with each phase's call wrapped in a timer, and prints the time to first token and every
phase's p50 and maximum in microseconds: what the host does before the first kernel runs
(``add_request``, ``schedule``, ``apply``, ``prepare``, ``upload``, the graph launch) and
what overlaps the GPU (``sampling.metadata``). Before that, the host cost of one graph replay
per captured size it can reach (launch only, the GPU idle).

``--timeline`` instead prints when each call of a request's path starts and ends, measured from
the moment ``add_request`` is called (p50 over the requests), and the GPU's time from the
prefill step's first launch to its sampled ids (CUDA events): where the time between the
kernels' end and the token on the host goes.
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


def _wrap(obj: Any, name: str, record: Callable[[float, float], None]) -> None:
    """Replace ``obj.name`` with a wrapper that calls ``record(start, end)`` after each call."""
    fn: Callable[..., Any] = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            record(start, time.perf_counter())

    setattr(obj, name, wrapper)


def _timed(obj: Any, name: str, label: str, acc: dict[str, list[float]]) -> None:
    """Append each call's seconds to ``acc[label]``."""
    _wrap(obj, name, lambda start, end: acc[label].append(end - start))


def _marked(obj: Any, name: str, label: str, marks: list[tuple[str, float, float]]) -> None:
    """Append ``(label, start, end)`` to ``marks`` per call."""
    _wrap(obj, name, lambda start, end: marks.append((label, start, end)))


def timeline(core: Any, prompts: list[list[int]]) -> None:
    """Print each traced call's p50 start and end (us after ``add_request`` was called), by
    its order within a request, and the GPU's time from the first launch to the sampled ids."""
    import torch

    from cadence.bench.ttft import time_one

    runner = core.runner
    marks: list[tuple[str, float, float]] = []
    _marked(core, "add_request", "add_request", marks)
    _marked(core.scheduler, "schedule", "schedule", marks)
    _marked(core.runner, "execute_model", "execute_model", marks)
    _marked(runner.copier, "finish", "wait for ids", marks)
    _marked(core.scheduler, "update_from_output", "update", marks)
    # The calls inside those: where the host's time before the launch and after the ids goes.
    kv = core.scheduler.kv_cache_manager
    for obj, name, label in (
            (kv, "get_computed_blocks", "  prefix lookup"),
            (kv, "allocate_slots", "  allocate"),
            (kv, "free", "  free blocks"),
            (core.scheduler, "_make_output", "  scheduler output"),
            (core.scheduler, "flush_deferred_caching", "flush caching"),
            (runner.input_batch, "apply", "  apply"),
            (runner.sampling, "update", "  sampling.update"),
            (runner.input_batch, "prepare", "  prepare"),
            (runner.buffers, "upload", "  upload"),
            (runner.sampling, "score_prompts", "  score_prompts"),
            (runner.model, "compute_logits", "  compute_logits"),
            (runner.sampling, "metadata", "  sampling.metadata"),
            (runner, "sampler", "  sampler"),
            (runner.scatter_kernel, "scatter", "  scatter"),
            (runner.sampling, "record_history", "  record_history")):
        _marked(obj, name, label, marks)
    # One level further down (module functions are looked up at each call, so wrapping the
    # module's name reaches them). Each mark adds ~1 us to the call it times.
    import cadence.scheduler.scheduler as scheduler_module
    import cadence.worker.input_batch as input_batch_module
    import cadence.worker.step_buffers as step_buffers_module
    for obj, name, label in (
            (core.scheduler, "add_request", "  scheduler.add_request"),
            (scheduler_module, "scheduled_request_data", "    request data"),
            (kv.block_pool, "get_new_blocks", "    get_new_blocks"),
            (runner.input_batch, "add", "    batch.add"),
            (input_batch_module, "layout_step", "    layout_step"),
            (runner, "_buckets", "  buckets"),
            (step_buffers_module, "stage_step", "    stage_step"),
            (runner.main, "copy_2d_ptr_async", "    copy 2d"),
            (runner.main, "copy_ptr_async", "    copy")):
        _marked(obj, name, label, marks)
    events: list[tuple[Any, Any]] = []
    graph_ends: list[Any] = []
    for graphs in (runner.mixed_graphs, runner.fresh_graphs):
        if graphs is None:
            continue
        replay = graphs.replay

        def marked_replay(size: int, _replay: Callable[..., Any] = replay) -> Any:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            events.append((start, None))
            began = time.perf_counter()
            out = _replay(size)
            marks.append(("graph launch", began, time.perf_counter()))
            graph_end = torch.cuda.Event(enable_timing=True)
            graph_end.record()
            graph_ends.append(graph_end)
            return out

        graphs.replay = marked_replay
    _marked(runner.copier, "start", "copy ids", marks)
    start_copy = runner.copier.start

    def copy_and_mark(*args: Any, **kwargs: Any) -> Any:
        out = start_copy(*args, **kwargs)
        if events and events[-1][1] is None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            events[-1] = (events[-1][0], end)
        return out

    runner.copier.start = copy_and_mark
    rows: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    gpu_ms: list[float] = []
    graph_ms: list[float] = []
    ttft: list[float] = []
    for i, prompt in enumerate(prompts):
        marks.clear()
        events.clear()
        graph_ends.clear()
        ttft.append(time_one(core, prompt, f"tl-{i}"))
        torch.cuda.synchronize()
        origin = min(start for _, start, _ in marks)  # add_request's call
        seen: dict[str, int] = defaultdict(int)
        for label, start, end in sorted(marks, key=lambda m: m[1]):
            rows[(seen[label], label)].append((start - origin, end - origin))
            seen[label] += 1
        if events and events[0][1] is not None:
            gpu_ms.append(events[0][0].elapsed_time(events[0][1]))
            graph_ms.append(events[0][0].elapsed_time(graph_ends[0]))
    print(_row("TTFT", ttft))
    if gpu_ms:
        gpu_ms.sort()
        graph_ms.sort()
        mid = len(gpu_ms) // 2
        print(f"GPU, first launch -> its graph's end: p50 {graph_ms[mid] * 1e3:.1f} us; -> the "
              f"sampled ids staged: p50 {gpu_ms[mid] * 1e3:.1f} us")
    order = sorted(rows, key=lambda key: sorted(s for s, _ in rows[key])[len(rows[key]) // 2])
    for key in order:
        starts = sorted(s for s, _ in rows[key])
        ends = sorted(e for _, e in rows[key])
        mid = len(starts) // 2
        print(f"{key[1]:>16s} #{key[0]}  n={len(starts):3d}  start {starts[mid] * 1e6:8.1f} us"
              f"  end {ends[mid] * 1e6:8.1f} us")


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
    p.add_argument("--timeline", action="store_true",
                   help="when each call of a request's path starts and ends (see above)")
    ns = p.parse_args()
    if ns.input_len < 1 or ns.repeats < 1:
        p.error(f"--input-len and --repeats must be at least 1, got {ns.input_len} and "
                f"{ns.repeats}")
    args = EngineArgs.from_cli_args(ns)
    args.skip_tokenizer_init = True
    args.max_num_seqs = min(args.max_num_seqs, 8)  # as bench ttft runs
    if args.max_model_len is None:
        args.max_model_len = ns.input_len + 16
    if args.max_num_batched_tokens is None:
        args.max_num_batched_tokens = max(8192, ns.input_len)
    core = EngineCore(args)
    runner = core.runner
    prompts = random_prompts(ns.repeats + 4, ns.input_len, core.vocab_size, seed=5)
    for i in range(4):
        time_one(core, prompts[i], f"warm-{i}")
    if ns.timeline:
        if runner.device.type != "cuda":
            p.error("--timeline needs a CUDA device (it times the GPU with CUDA events)")
        timeline(core, prompts[4:])
        return 0
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
