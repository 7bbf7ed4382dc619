"""Per-step host and GPU figures of a trace: GPU busy time, idle gaps, kernels, syncs, phases.

Definitions (all in microseconds):
- host_us: duration of the step's host range.
- gpu_busy_us: length of the union of the step's GPU activity intervals (all streams).
- gap_us: for consecutive steps that both launched GPU work, the first start of step k+1 minus
  the last end of step k, clamped at 0 (overlap counts as no gap).
- gpu_idle_fraction: 1 - (union of all steps' GPU intervals) / window, where the window runs
  from the first GPU start to the last GPU end of the measured steps.
- sync_us: host time in CUDA synchronize calls (stream, event, device) inside the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from cadence.trace.steps import STEP_NAME, ParsedTrace, parse, union_length


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


def summarize(trace: str | Path | dict | list | ParsedTrace,
              step_name: str = STEP_NAME) -> dict[str, Any]:
    """Figures of a trace (see the module docstring); raises ValueError without step ranges."""
    parsed = trace if isinstance(trace, ParsedTrace) else parse(trace, step_name)
    phase_durs: dict[str, list[float]] = {}
    for r in parsed.phases:
        phase_durs.setdefault(r.name, []).append(r.dur_us)
    out = _report(parsed, phase_durs)
    # GPU activities per way of finding their step; "none": launched outside every step.
    out["attribution"] = parsed.attribution
    return out


def step_gaps(parsed: ParsedTrace) -> list[tuple[int, float, float]]:
    """(step k+1, idle start, idle end) between consecutive steps with GPU work; an overlap
    gives a zero-length gap."""
    gpu_steps = [s for s in parsed.steps if s.gpu_start_us is not None]
    return [(b.index, a.gpu_end_us, max(a.gpu_end_us, b.gpu_start_us))
            for a, b in zip(gpu_steps, gpu_steps[1:])]


def _report(parsed: ParsedTrace, phase_durs: dict[str, list[float]]) -> dict[str, Any]:
    steps, has_gpu = parsed.steps, parsed.has_gpu
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
        gaps = [end - start for _, start, end in step_gaps(parsed)]
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
