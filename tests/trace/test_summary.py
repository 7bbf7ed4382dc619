"""The per-step summary of a hand-built trace whose steps' GPU work overlaps: figures worked out
by hand from the module's definitions, and the text ``format_summary`` prints."""

from __future__ import annotations

import pytest

from cadence.trace.summary import format_summary, summarize


def _x(cat: str, name: str, ts: float, dur: float, **args: object) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}
    if args:
        event["args"] = args
    return event


def overlapping_trace() -> dict:
    """Host steps S0 [0, 100], S1 [100, 200], S2 [200, 300], each opening with a 4 us
    "schedule" range at its first microsecond.
      S0 launches k1 [10, 50] and k2 [90, 130] (k2 runs into S1's work): busy 80, [10, 130]
      S1 launches k3 [120, 170] and a memset [130, 135] on stream 20:     busy 50, [120, 170]
      S2 launches nothing; it waits in a runtime sync (5 us) and a driver sync (3 us).
    Gap S0 -> S1: k3 starts before k2 ends, so 0. Window [10, 170] = 160 us; the union of all
    the work is [10, 50] + [90, 170] = 120 us (the steps' own busy times sum to 130), so the
    GPU is idle 40 / 160 = 25% of the window."""
    events = [_x("user_annotation", "engine_step", 100 * k, 100) for k in range(3)]
    events += [_x("cpu_op", "schedule", 100 * k, 4) for k in range(3)]
    gpu = [(1, 5, "kernel", "k1", 10, 40, 7), (2, 6, "kernel", "k2", 90, 40, 7),
           (3, 105, "kernel", "k3", 120, 50, 7), (4, 106, "gpu_memset", "Memset", 130, 5, 20)]
    for corr, host_ts, cat, name, start, dur, stream in gpu:
        events.append(_x("cuda_runtime", "cudaLaunchKernel", host_ts, 1, correlation=corr))
        events.append(_x(cat, name, start, dur, correlation=corr, stream=stream))
    events.append(_x("cuda_runtime", "cudaStreamSynchronize", 250, 5, correlation=50))
    events.append(_x("cuda_driver", "cuStreamSynchronize", 260, 3, correlation=51))
    return {"traceEvents": events}


def test_overlapping_steps_figures() -> None:
    s = summarize(overlapping_trace())
    assert s["num_steps"] == 3 and s["has_gpu"]
    assert [(st["gpu_busy_us"], st["kernels"], st["memsets"], st["memcpys"])
            for st in s["steps"][:2]] == [(80, 2, 0, 0), (50, 1, 1, 0)]
    assert s["steps"][2]["gpu_start_us"] is None
    assert s["gaps_us"] == [0]
    assert s["gpu_window_us"] == 160
    # The union of every step's work, not the sum of the steps' busy times (which overlap).
    assert s["gpu_idle_fraction"] == pytest.approx(0.25)
    # Host syncs are figures of every step, a step without GPU work included.
    assert [(st["syncs"], st["sync_us"]) for st in s["steps"]] == [(0, 0), (0, 0), (2, 8)]
    assert s["syncs_per_step"]["max"] == 2 and s["syncs_per_step"]["mean"] == pytest.approx(2 / 3)
    assert s["sync_us"]["max"] == 8
    assert s["memcpys_per_step"]["max"] == 0
    # A range that opens at its step's first microsecond belongs to that step.
    assert s["phases_us"]["schedule"]["count"] == 3
    assert s["phases_us"]["schedule"]["per_step"] == 4


def test_format_summary_prints_percent_and_milliseconds() -> None:
    lines = format_summary(summarize(overlapping_trace())).splitlines()
    assert lines[0] == "steps: 3 (2 with GPU work)"
    assert "GPU idle fraction:      25.00% of 0.160 ms" in lines
    assert "GPU idle gap per step:  p50 0.0 us  p90 0.0 us  max 0.0 us  mean 0.0 us" in lines
    # memsets are no memcpys: every step copied nothing.
    assert "memcpys per step:       p50 0.0   p90 0.0   max 0.0   mean 0.0 " in lines


def test_format_summary_of_a_cpu_only_trace() -> None:
    events = [_x("user_annotation", "engine_step", 0, 50), _x("cpu_op", "forward", 10, 30)]
    lines = format_summary(summarize({"traceEvents": events})).splitlines()
    assert lines[0] == "steps: 1 (0 with GPU work)"
    assert "GPU: no GPU activity in the trace (CPU-only run)" in lines
    assert lines[-1] == "phase forward   x1     p50 30.0 us  p90 30.0 us  per step 30.0 us"
