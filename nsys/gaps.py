"""Per-step host and GPU figures from a trace: GPU busy time, idle gaps, kernels per step.

Input: a torch-profiler Chrome trace (``.json`` or ``.json.gz``, as written by
``nsys/torch_trace.py``) or an Nsight Systems SQLite export (``.sqlite``, from
``nsys export --type sqlite``; see ``nsys_sqlite.py``). Steps are the host ranges named
``engine_step``. A GPU activity (kernel, memcpy, memset) belongs to the step whose host range
contains the CUDA API call that launched it (matched by correlation id), so work launched in step
k and run after step k returned on the host still counts for step k; work launched outside every
step is ignored. When the launch call is not in the trace (the torch profiler keeps only some
driver-API calls: graph launches through cuda-python are dropped), the host op the activity is
linked to ("External id") stands in for it; failing that, the activity takes the step of the
closest earlier linked activity on its stream. Traces with no links at all fall back to GPU
start times: an activity belongs to the last step that began before it. ``attribution`` counts
the activities found each way.

Definitions (all in microseconds):
- host_us: duration of the step's host range.
- gpu_busy_us: length of the union of the step's GPU activity intervals (all streams).
- gap_us: for consecutive steps that both launched GPU work, the first start of step k+1 minus
  the last end of step k, clamped at 0 (overlap counts as no gap).
- gpu_idle_fraction: 1 - (union of all steps' GPU intervals) / window, where the window runs
  from the first GPU start to the last GPU end of the measured steps.
- sync_us: host time in CUDA synchronize calls (stream, event, device) inside the step.

Usage: ``python nsys/gaps.py TRACE [--json] [--step-name engine_step]``.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nsys.nsys_sqlite import load_nsys_sqlite  # noqa: E402

STEP_NAME = "engine_step"
# cadence.profiling.PHASES, repeated so that this script needs neither torch nor cadence.
PHASES = ("schedule", "prepare", "forward", "replay", "sample", "copy", "update")
_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
_KERNEL_CATS = {"kernel"}
_MEMCPY_CATS = {"gpu_memcpy", "memcpy"}


@dataclass
class StepFigures:
    index: int
    host_start_us: float
    host_us: float
    gpu_busy_us: float | None = None
    gpu_start_us: float | None = None
    gpu_end_us: float | None = None
    kernels: int = 0
    memcpys: int = 0
    memsets: int = 0
    syncs: int = 0
    sync_us: float = 0.0
    intervals: list[tuple[float, float]] = field(default_factory=list, repr=False)


def load_events(trace: str | Path | dict | list) -> list[dict]:
    """The complete ("X") events of a trace given as a path, a trace dict or an event list."""
    if isinstance(trace, (str, Path)):
        path = Path(trace)
        if path.suffix in (".sqlite", ".db"):
            data: Any = load_nsys_sqlite(path)
        elif path.suffix == ".gz":
            with gzip.open(path, "rt") as f:
                data = json.load(f)
        else:
            with open(path) as f:
                data = json.load(f)
    else:
        data = trace
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]


def _category(event: dict) -> str:
    return str(event.get("cat") or "").lower()


def _is_gpu_side(cat: str) -> bool:
    # GPU activity and the GPU-timeline copies of host annotations (gpu_user_annotation).
    return cat in _GPU_CATS or cat.startswith("gpu_")


def _correlation(event: dict) -> int | None:
    args = event.get("args") or {}
    value = args.get("correlation")
    return int(value) if value is not None else None


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def stats(values: Sequence[float]) -> dict[str, float] | None:
    """p50/p90 (linear interpolation), min, max and mean; None for no values."""
    if not values:
        return None
    arr = np.asarray(values, dtype=np.float64)
    return {
        "p50": float(np.percentile(arr, 50)),
        "p90": float(np.percentile(arr, 90)),
        "min": float(arr.min()),
        "max": float(arr.max()),
        "mean": float(arr.mean()),
    }


class _StepIndex:
    """Finds the step whose host range contains a host timestamp."""

    def __init__(self, steps: list[StepFigures]) -> None:
        self.starts = [s.host_start_us for s in steps]
        self.ends = [s.host_start_us + s.host_us for s in steps]

    def containing(self, ts: float) -> int | None:
        i = bisect.bisect_right(self.starts, ts) - 1
        if i >= 0 and ts <= self.ends[i]:
            return i
        return None

    def last_started(self, ts: float) -> int | None:
        i = bisect.bisect_right(self.starts, ts) - 1
        return i if i >= 0 else None


def _steps(events: list[dict], step_name: str) -> list[StepFigures]:
    marks = sorted(
        (e for e in events if e.get("name") == step_name and not _is_gpu_side(_category(e))),
        key=lambda e: float(e["ts"]),
    )
    return [StepFigures(i, float(e["ts"]), float(e["dur"])) for i, e in enumerate(marks)]


def _stream(event: dict) -> tuple[Any, Any]:
    args = event.get("args") or {}
    return args.get("device"), args.get("stream", event.get("tid"))


def _external_id(event: dict) -> int | None:
    value = (event.get("args") or {}).get("External id")
    return int(value) if value else None  # 0 means "no linked op"


# How a GPU activity found its step (the keys of the ``attribution`` figure).
BY_LAUNCH, BY_OP, BY_STREAM, BY_TIME = "launch", "op", "stream_order", "start_time"


def _attribute(
    gpu_events: list[dict],
    launch_ts: dict[int, float],
    op_ts: dict[int, float],
    index: _StepIndex,
) -> list[tuple[int | None, str | None]]:
    """(step index or None, how it was found) for every GPU activity."""
    if not any(_correlation(e) is not None or _external_id(e) for e in gpu_events):
        # No link to the host at all: the last step that began before the activity started.
        return [(index.last_started(float(e["ts"])), BY_TIME) for e in gpu_events]
    owners: list[tuple[int | None, str | None]] = []
    for e in gpu_events:
        host_ts = launch_ts.get(_correlation(e))  # type: ignore[arg-type]
        if host_ts is not None:
            owners.append((index.containing(host_ts), BY_LAUNCH))
            continue
        # The torch profiler drops most driver-API calls (graph launches through cuda-python,
        # for one) but still links their GPU work to the innermost host op around the call.
        host_ts = op_ts.get(_external_id(e))  # type: ignore[arg-type]
        owners.append((index.containing(host_ts), BY_OP) if host_ts is not None else (None, None))
    # Still unlinked (the launch preceded the capture, or the exporter kept no link): a stream
    # runs its work in launch order, so the activity takes the step of the closest earlier
    # linked activity on its stream, and no step when none precedes it.
    order = sorted(range(len(gpu_events)), key=lambda k: float(gpu_events[k]["ts"]))
    last_on_stream: dict[tuple[Any, Any], int | None] = {}
    for k in order:
        key = _stream(gpu_events[k])
        step, how = owners[k]
        if how is not None:
            last_on_stream[key] = step
        elif key in last_on_stream:
            owners[k] = (last_on_stream[key], BY_STREAM)
    return owners


def _is_sync(event: dict) -> bool:
    return _category(event) in ("cuda_runtime", "cuda_driver") and "Synchronize" in str(
        event.get("name", "")
    )


def summarize(trace: str | Path | dict | list, step_name: str = STEP_NAME) -> dict[str, Any]:
    """Figures of a trace (see the module docstring); raises ValueError without step ranges."""
    events = load_events(trace)
    steps = _steps(events, step_name)
    if not steps:
        raise ValueError(f"the trace has no host ranges named {step_name!r}")
    index = _StepIndex(steps)

    launch_ts: dict[int, float] = {}
    op_ts: dict[int, float] = {}
    gpu_events: list[dict] = []
    phase_durs: dict[str, list[float]] = {}
    for e in events:
        cat = _category(e)
        if cat in _GPU_CATS:
            gpu_events.append(e)
            continue
        if _is_gpu_side(cat):
            continue
        corr = _correlation(e)
        if corr is not None:
            launch_ts[corr] = float(e["ts"])
        ext = _external_id(e)
        if ext is not None and cat in ("cpu_op", "user_annotation"):
            op_ts.setdefault(ext, float(e["ts"]))
        name = e.get("name")
        if name in PHASES and index.containing(float(e["ts"])) is not None:
            phase_durs.setdefault(name, []).append(float(e["dur"]))
        if _is_sync(e):
            i = index.containing(float(e["ts"]))
            if i is not None:
                steps[i].syncs += 1
                steps[i].sync_us += float(e["dur"])

    owners = _attribute(gpu_events, launch_ts, op_ts, index)
    attribution = {BY_LAUNCH: 0, BY_OP: 0, BY_STREAM: 0, BY_TIME: 0, "none": 0}
    for e, (i, how) in zip(gpu_events, owners):
        attribution[how if i is not None and how is not None else "none"] += 1
        if i is None:
            continue
        step = steps[i]
        start = float(e["ts"])
        step.intervals.append((start, start + float(e["dur"])))
        cat = _category(e)
        step.kernels += cat in _KERNEL_CATS
        step.memcpys += cat in _MEMCPY_CATS
        step.memsets += cat in ("gpu_memset", "memset")

    for step in steps:
        if step.intervals:
            step.gpu_busy_us = union_length(step.intervals)
            step.gpu_start_us = min(s for s, _ in step.intervals)
            step.gpu_end_us = max(e for _, e in step.intervals)
    out = _report(steps, phase_durs, has_gpu=bool(gpu_events))
    # GPU activities per way of finding their step; "none": launched outside every step.
    out["attribution"] = attribution
    return out


def _report(
    steps: list[StepFigures], phase_durs: dict[str, list[float]], has_gpu: bool
) -> dict[str, Any]:
    n = len(steps)
    out: dict[str, Any] = {
        "num_steps": n,
        "has_gpu": has_gpu,
        "host_us": stats([s.host_us for s in steps]),
        "phases_us": {
            name: {**(stats(d) or {}), "count": len(d), "per_step": sum(d) / n}
            for name, d in sorted(phase_durs.items())
        },
        "gpu_busy_us": None,
        "gap_us": None,
        "gaps_us": [],
        "gpu_window_us": None,
        "gpu_idle_fraction": None,
        "kernels_per_step": None,
        "memcpys_per_step": None,
        "syncs_per_step": None,
        "sync_us": None,
    }
    gpu_steps = [s for s in steps if s.gpu_start_us is not None]
    if has_gpu:
        out["syncs_per_step"] = stats([float(s.syncs) for s in steps])
        out["sync_us"] = stats([s.sync_us for s in steps])
        out["kernels_per_step"] = stats([float(s.kernels) for s in steps])
        out["memcpys_per_step"] = stats([float(s.memcpys) for s in steps])
    if gpu_steps:
        gaps = [max(0.0, b.gpu_start_us - a.gpu_end_us) for a, b in zip(gpu_steps, gpu_steps[1:])]
        window = max(s.gpu_end_us for s in gpu_steps) - min(s.gpu_start_us for s in gpu_steps)
        busy = union_length(iv for s in gpu_steps for iv in s.intervals)
        out["gpu_busy_us"] = stats([s.gpu_busy_us for s in gpu_steps])
        out["gap_us"] = stats(gaps)
        out["gaps_us"] = gaps
        out["gpu_window_us"] = window
        out["gpu_idle_fraction"] = 1.0 - busy / window if window > 0 else 0.0
    out["steps"] = [{k: v for k, v in asdict(s).items() if k != "intervals"} for s in steps]
    return out


def _fmt(s: dict[str, float] | None, unit: str = "us") -> str:
    if s is None:
        return "n/a"
    return (
        f"p50 {s['p50']:.1f} {unit}  p90 {s['p90']:.1f} {unit}  "
        f"max {s['max']:.1f} {unit}  mean {s['mean']:.1f} {unit}"
    )


def format_summary(summary: dict[str, Any]) -> str:
    n = summary["num_steps"]
    gpu_steps = sum(1 for s in summary["steps"] if s["gpu_start_us"] is not None)
    lines = [
        f"steps: {n} ({gpu_steps} with GPU work)",
        f"host time per step:     {_fmt(summary['host_us'])}",
    ]
    if summary["has_gpu"]:
        idle = summary["gpu_idle_fraction"]
        lines += [
            f"GPU busy per step:      {_fmt(summary['gpu_busy_us'])}",
            f"GPU idle gap per step:  {_fmt(summary['gap_us'])}",
            "GPU idle fraction:      "
            + (
                f"{idle * 100:.2f}% of {summary['gpu_window_us'] / 1e3:.3f} ms"
                if idle is not None
                else "n/a"
            ),
            f"kernels per step:       {_fmt(summary['kernels_per_step'], '')}",
            f"memcpys per step:       {_fmt(summary['memcpys_per_step'], '')}",
            f"host syncs per step:    {_fmt(summary['syncs_per_step'], '')}",
            f"host sync time per step:{_fmt(summary['sync_us'])}",
        ]
    else:
        lines.append("GPU: no GPU activity in the trace (CPU-only run)")
    for name, p in summary["phases_us"].items():
        lines.append(
            f"phase {name:9s} x{p['count']:<5d} p50 {p['p50']:.1f} us  "
            f"p90 {p['p90']:.1f} us  per step {p['per_step']:.1f} us"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nsys/gaps.py", description=__doc__.splitlines()[0])
    p.add_argument("trace", help="torch-profiler Chrome trace (.json/.json.gz) or nsys .sqlite")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--step-name", default=STEP_NAME, help="host range that marks one step")
    ns = p.parse_args(argv)
    try:
        summary = summarize(ns.trace, ns.step_name)
    except ValueError as exc:
        print(f"gaps.py: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=1) if ns.json else format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
