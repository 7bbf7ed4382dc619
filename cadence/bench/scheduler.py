"""`cadence bench scheduler`: host cost of one schedule() + update_from_output() in steady decode.

No model runs: a fake runner output samples one token per scheduled request, so the figure is
the scheduler's own Python cost per step (the CPU time that async scheduling hides behind the
GPU step). Built outside the timed region, the fake output costs nothing in the figure.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
from collections import deque

from cadence.bench.common import Record, git_commit, now
from cadence.bench.report import add_report_args, emit
from cadence.cli_config import add_config_arg, parse_with_config
from cadence.cli_types import int_at_least
from cadence.config import SCHEDULING_POLICIES, CacheConfig, SchedulerConfig
from cadence.runner_output import ModelRunnerOutput
from cadence.sampling_params import SamplingParams
from cadence.scheduler.async_scheduler import AsyncScheduler
from cadence.scheduler.kv_cache_manager import make_block_hasher
from cadence.scheduler.output import SchedulerOutput
from cadence.scheduler.request import Request
from cadence.scheduler.scheduler import Scheduler
from cadence.user_errors import ArgumentParser


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="cadence bench scheduler")
    p.add_argument("--num-requests", type=int_at_least(1), default=256,
                   help="running decode requests")
    p.add_argument("--prompt-len", type=int_at_least(1), default=128)
    p.add_argument("--steps", type=int_at_least(1), default=300,
                   help="timed decode steps per repeat")
    p.add_argument("--repeats", type=int_at_least(1), default=5,
                   help="fresh schedulers, figures pooled")
    p.add_argument("--warmup", type=int_at_least(0), default=30, help="untimed decode steps first")
    p.add_argument("--block-size", type=int_at_least(1), default=16)
    p.add_argument("--policy", choices=list(SCHEDULING_POLICIES), default="fcfs")
    p.add_argument("--async-scheduling", action="store_true", help="AsyncScheduler, depth 2")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument(
        "--no-gc-freeze",
        action="store_true",
        help="leave the long-lived scheduler state in the collected heap (the engine core "
        "freezes it after start-up)",
    )
    add_report_args(p)
    add_config_arg(p)
    return p


def _fake_output(so: SchedulerOutput, step: int) -> ModelRunnerOutput:
    req_ids = list(so.num_scheduled_tokens)
    token = 1 + step % 1000
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
        sampled_token_ids=[[token] for _ in req_ids],
    )


STEP_TOKENS = 8192  # the scheduler's token budget a step


def prefill_steps(ns: argparse.Namespace) -> int:
    """Steps until every prompt is in (the first requests decode meanwhile)."""
    return -(-ns.num_requests * ns.prompt_len // STEP_TOKENS) + 1


def build_scheduler(ns: argparse.Namespace) -> Scheduler:
    # NOTE: room for the prefill's steps as well: a request that finished before the last
    # prompt is in would keep the batch from ever being all decode.
    max_len = ns.prompt_len + prefill_steps(ns) + ns.warmup + ns.steps + 64
    blocks_per_req = -(-max_len // ns.block_size)
    sched_cfg = SchedulerConfig(
        max_num_seqs=ns.num_requests,
        max_num_batched_tokens=STEP_TOKENS,
        max_model_len=max_len,
        policy=ns.policy,
        async_scheduling=ns.async_scheduling,
    )
    cache_cfg = CacheConfig(
        block_size=ns.block_size, enable_prefix_caching=not ns.no_prefix_caching
    )
    cls = AsyncScheduler if ns.async_scheduling else Scheduler
    scheduler = cls(sched_cfg, cache_cfg, ns.num_requests * blocks_per_req + 1)
    hasher = make_block_hasher(ns.block_size)
    for i in range(ns.num_requests):
        params = SamplingParams(
            temperature=0.0, max_tokens=max_len - ns.prompt_len, ignore_eos=True
        )
        prompt = [(i * 7919 + j) % 30000 + 1 for j in range(ns.prompt_len)]
        scheduler.add_request(
            Request(f"r{i}", prompt, params, eos_token_id=0, priority=i % 3, block_hasher=hasher)
        )
    return scheduler


def _run_once(ns: argparse.Namespace) -> tuple[list[float], list[float]]:
    """One fresh scheduler: warm up into steady decode, then time ``ns.steps`` steps."""
    scheduler = build_scheduler(ns)
    depth = 2 if ns.async_scheduling else 1
    in_flight: deque[tuple[SchedulerOutput, ModelRunnerOutput]] = deque()
    sched_ms: list[float] = []
    update_ms: list[float] = []
    step = 0
    decode_steps = 0
    # Every step past this is one the workload's shape cannot need.
    max_step = prefill_steps(ns) + ns.warmup + ns.steps + depth + 16
    gc.collect()
    if not ns.no_gc_freeze:
        gc.freeze()
    try:
        while len(sched_ms) < ns.steps:
            if step > max_step:
                raise RuntimeError(f"the scheduler did not reach {ns.num_requests} requests "
                                   f"decoding together within {max_step} steps.")
            t0 = time.perf_counter_ns()
            so = scheduler.schedule()
            t1 = time.perf_counter_ns()
            in_flight.append((so, _fake_output(so, step)))
            step += 1
            if len(in_flight) < depth:
                continue
            old_so, old_out = in_flight.popleft()
            t2 = time.perf_counter_ns()
            scheduler.update_from_output(old_so, old_out)
            t3 = time.perf_counter_ns()
            steady = len(so.num_scheduled_tokens) == ns.num_requests and all(
                n == 1 for n in so.num_scheduled_tokens.values()
            )
            decode_steps = decode_steps + 1 if steady else 0
            if decode_steps > ns.warmup:
                sched_ms.append((t1 - t0) / 1e6)
                update_ms.append((t3 - t2) / 1e6)
    finally:
        gc.unfreeze()
    return sched_ms, update_ms


def run(ns: argparse.Namespace) -> dict[str, object]:
    sched_ms: list[float] = []
    update_ms: list[float] = []
    repeat_medians: list[float] = []
    for _ in range(ns.repeats):
        s, u = _run_once(ns)
        sched_ms += s
        update_ms += u
        repeat_medians.append(round(statistics.median(a + b for a, b in zip(s, u, strict=True)), 4))
    total = sorted(a + b for a, b in zip(sched_ms, update_ms, strict=True))
    return {
        "num_requests": ns.num_requests,
        "async_scheduling": ns.async_scheduling,
        "policy": ns.policy,
        "prefix_caching": not ns.no_prefix_caching,
        "gc_freeze": not ns.no_gc_freeze,
        "steps": len(total),
        "median_ms": round(statistics.median(total), 4),
        "p90_ms": round(total[int(0.9 * (len(total) - 1))], 4),
        "schedule_median_ms": round(statistics.median(sched_ms), 4),
        "update_median_ms": round(statistics.median(update_ms), 4),
        "repeat_median_ms": repeat_medians,
    }


def main(argv: list[str] | None = None) -> int:
    ns = parse_with_config(_parser(), argv)
    figures = run(ns)
    mode = "async" if ns.async_scheduling else "sync"
    if not ns.json:  # --json: the record's line alone
        print(
            f"schedule()+update_from_output(), {ns.num_requests} running decode requests "
            f"({mode}, {ns.policy}): median {figures['median_ms']:.3f} ms, p90 "
            f"{figures['p90_ms']:.3f} ms (schedule {figures['schedule_median_ms']:.3f} ms, "
            f"update {figures['update_median_ms']:.3f} ms)"
        )
    record = Record(
        bench="scheduler",
        model="none (fake runner output)",
        device=f"host cpu ({platform.processor() or platform.machine()}), "
        f"python {platform.python_version()}",
        commit=git_commit(),
        date=now(),
        figures=figures,
    )
    row = {k: v for k, v in figures.items() if not isinstance(v, list)}
    emit(record, ns, [row])
    return 0


if __name__ == "__main__":
    sys.exit(main())
