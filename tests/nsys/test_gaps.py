from __future__ import annotations

import gzip
import json
import sqlite3

import pytest

from nsys.gaps import main, summarize, union_length

# Three back-to-back host steps, S0 [0, 100], S1 [100, 200], S2 [200, 300] (microseconds).
# Launch calls (correlation ids) sit inside the steps; the GPU runs each one later.
#   S0: c1 kernel [15, 60], c2 kernel [60, 105] (runs past the host end of S0),
#       c3 memcpy [85, 95] on the copy stream (overlaps c2)  -> busy 90, span [15, 105]
#   S1: c4 kernel [115, 150], c77 kernel [152, 158] (its launch is missing from the trace),
#       c5 kernel [160, 190], c6 memcpy [190, 195]          -> busy 76, span [115, 195]
#   S2: c7 kernel [230, 260], c8 kernel [262, 280]                       -> busy 48, [230, 280]
# Gaps: 115 - 105 = 10 and 230 - 195 = 35. Window [15, 280] = 265, busy 214.
# The Chrome trace adds to S2 a kernel k_op [260, 262] linked only through its host op: S2 busy
# 50 and busy 216 in all.
LAUNCHES = [  # (correlation, host ts, name)
    (1, 10, "cudaLaunchKernel"),
    (2, 20, "cuLaunchKernel"),
    (3, 30, "cudaMemcpyAsync"),
    (4, 110, "cudaGraphLaunch"),
    (5, 111, "cudaGraphLaunch"),
    (6, 130, "cudaMemcpyAsync"),
    (7, 210, "cudaLaunchKernel"),
    (8, 220, "cudaLaunchKernel"),
]
GPU = [  # (correlation, cat, start, end, stream)
    (1, "kernel", 15, 60, 7),
    (2, "kernel", 60, 105, 7),
    (3, "gpu_memcpy", 85, 95, 20),
    (4, "kernel", 115, 150, 7),
    (77, "kernel", 152, 158, 7),  # launch not in the trace: S1, after c4 on its stream
    (5, "kernel", 160, 190, 7),
    (6, "gpu_memcpy", 190, 195, 20),
    (7, "kernel", 230, 260, 7),
    (8, "kernel", 262, 280, 7),
]


def _x(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}
    if args:
        event["args"] = args
    return event


def synthetic_trace(correlated: bool = True) -> dict:
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        # Warm-up work launched before the first step: not counted anywhere.
        _x("cuda_runtime", "cudaLaunchKernel", -50, 2, correlation=99),
        _x("kernel", "warmup", -40, 10, stream=7, **({"correlation": 99} if correlated else {})),
        # Launched before the capture began (its launch call is not in the trace).
        _x("kernel", "early", -30, 5, stream=7, **({"correlation": 98} if correlated else {})),
    ]
    for i, start in enumerate((0, 100, 200)):
        events.append(_x("user_annotation", "engine_step", start, 100))
        # The GPU-timeline mirror of the step range is not a step and not GPU activity.
        events.append(_x("gpu_user_annotation", "engine_step", start + 15, 80))
        events.append(_x("cpu_op", "schedule", start + 1, 5 + i))
        events.append(_x("cpu_op", "aten::mm", start + 40, 3))
    events.append(_x("cpu_op", "update", 190, 8))
    # A driver-API launch the profiler dropped, inside an op it kept: S2 through the op's id
    # (in the uncorrelated variant, through its start time).
    events.append(_x("cpu_op", "launch_graph", 225, 2, **{"External id": 500}))
    links = {"correlation": 76, "External id": 500} if correlated else {}
    events.append(_x("kernel", "k_op", 260, 2, stream=7, **links))
    events.append(_x("cuda_runtime", "cudaEventSynchronize", 180, 7, correlation=50))
    for corr, ts, name in LAUNCHES:
        events.append(_x("cuda_runtime", name, ts, 1, correlation=corr))
        events.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "ts": ts})
    for corr, cat, start, end, stream in GPU:
        args = {"correlation": corr, "stream": stream} if correlated else {"stream": stream}
        events.append(_x(cat, f"k{corr}", start, end - start, **args))
    return {"traceEvents": events}


def test_union_length() -> None:
    assert union_length([]) == 0
    assert union_length([(0, 10), (5, 12), (20, 25), (25, 30)]) == 22
    assert union_length([(5, 6), (0, 10)]) == 10


def test_correlated_steps_busy_gaps_kernels() -> None:
    s = summarize(synthetic_trace())
    assert s["num_steps"] == 3 and s["has_gpu"]
    steps = s["steps"]
    assert [st["gpu_busy_us"] for st in steps] == [90, 76, 50]
    assert [(st["gpu_start_us"], st["gpu_end_us"]) for st in steps] == [
        (15, 105),
        (115, 195),
        (230, 280),
    ]
    assert [st["kernels"] for st in steps] == [2, 3, 3]
    # c77 by stream order; the warm-up kernels ("warmup", "early") belong to no step.
    assert s["attribution"] == {
        "launch": 8,
        "op": 1,
        "stream_order": 1,
        "start_time": 0,
        "none": 2,
    }
    assert [st["memcpys"] for st in steps] == [1, 1, 0]
    assert [st["host_us"] for st in steps] == [100, 100, 100]
    assert s["gaps_us"] == [10, 35]
    assert s["gap_us"]["p50"] == 22.5
    assert s["gap_us"]["p90"] == pytest.approx(32.5)
    assert s["gap_us"]["max"] == 35
    assert s["gpu_window_us"] == 265
    assert s["gpu_idle_fraction"] == pytest.approx(1 - 216 / 265)
    assert s["kernels_per_step"]["p50"] == 3
    assert [st["syncs"] for st in steps] == [0, 1, 0]
    assert steps[1]["sync_us"] == 7
    assert s["phases_us"]["schedule"]["count"] == 3
    assert s["phases_us"]["schedule"]["p50"] == 6
    assert s["phases_us"]["update"]["per_step"] == pytest.approx(8 / 3)


def test_overlapping_steps_have_zero_gap() -> None:
    trace = synthetic_trace()
    for e in trace["traceEvents"]:
        if e.get("name") == "k4":  # S1 starts while the S0 memcpy still runs
            e["ts"], e["dur"] = 100, 50
    s = summarize(trace)
    assert s["gaps_us"] == [0.0, 35]
    assert s["steps"][1]["gpu_busy_us"] == 50 + 6 + 30 + 5


def test_uncorrelated_trace_falls_back_to_gpu_start_times() -> None:
    s = summarize(synthetic_trace(correlated=False))
    # By start time c2 [60, 105] still belongs to S0 and the warm-up kernels (before S0) to none.
    assert [st["kernels"] for st in s["steps"]] == [2, 3, 3]
    assert [st["gpu_busy_us"] for st in s["steps"]] == [90, 76, 50]
    assert s["gaps_us"] == [10, 35]
    assert s["attribution"]["start_time"] == 10 and s["attribution"]["none"] == 2


def test_step_without_gpu_work_is_skipped_in_gaps() -> None:
    trace = synthetic_trace()
    trace["traceEvents"] = [
        e for e in trace["traceEvents"] if e.get("name") not in ("k4", "k77", "k5", "k6")
    ]
    s = summarize(trace)
    assert s["steps"][1]["gpu_busy_us"] is None and s["steps"][1]["kernels"] == 0
    assert s["gaps_us"] == [230 - 105]
    assert s["kernels_per_step"]["min"] == 0


def test_cpu_only_trace_has_host_figures_only() -> None:
    events = [_x("user_annotation", "engine_step", t, d) for t, d in ((0, 40), (50, 60), (120, 50))]
    events.append(_x("cpu_op", "aten::mm", 10, 5))
    s = summarize(events)
    assert s["num_steps"] == 3 and not s["has_gpu"]
    assert s["host_us"]["p50"] == 50 and s["host_us"]["max"] == 60
    assert s["gap_us"] is None and s["gpu_idle_fraction"] is None
    assert s["kernels_per_step"] is None


def test_no_steps_is_an_error() -> None:
    with pytest.raises(ValueError, match="engine_step"):
        summarize({"traceEvents": [_x("cpu_op", "aten::mm", 0, 1)]})


def test_files_and_cli(tmp_path, capsys) -> None:
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(synthetic_trace(), f)
    assert summarize(path)["gaps_us"] == [10, 35]
    assert main([str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu_window_us"] == 265
    assert main([str(path)]) == 0
    text = capsys.readouterr().out
    assert "steps: 3 (3 with GPU work)" in text and "GPU idle gap" in text
    assert main([str(path), "--step-name", "nothing"]) == 1
    capsys.readouterr()
    # A missing file or a folder: one line, no traceback.
    for bad in (tmp_path / "missing.json", tmp_path):
        assert main([str(bad)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("gaps.py: ") and err.count("\n") == 1, err


def _nsys_db(path) -> None:
    """An Nsight Systems export holding the synthetic trace, in nanoseconds."""
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, text TEXT, textId INT,
                                  globalTid INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, correlationId INT,
                                                  nameId INT, globalTid INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, correlationId INT,
                                                 shortName INT, streamId INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT, end INT, correlationId INT,
                                                 streamId INT);
        """
    )
    names = {"engine_step": 1, "cudaLaunchKernel": 2, "kern": 3, "cudaEventSynchronize": 4}
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, n) for n, i in names.items()])
    ns = 1000
    for start in (0, 100, 200):  # half the steps name themselves through StringIds
        text = None if start == 100 else "engine_step"
        con.execute(
            "INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, ?, 1)",
            (start * ns, (start + 100) * ns, text, names["engine_step"]),
        )
    con.execute("INSERT INTO NVTX_EVENTS VALUES (5000, NULL, 34, 'a mark', NULL, 1)")
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 50, 4, 1)", (180e3, 187e3))
    for corr, ts, _ in LAUNCHES:
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, 2, 1)",
            (ts * ns, (ts + 1) * ns, corr),
        )
    for corr, cat, start, end, stream in GPU:
        if cat == "kernel":
            con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, 3, ?)",
                (start * ns, end * ns, corr, stream),
            )
        else:
            con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, ?)",
                (start * ns, end * ns, corr, stream),
            )
    con.commit()
    con.close()


def test_nsys_sqlite_export_gives_the_same_figures(tmp_path) -> None:
    path = tmp_path / "run.sqlite"
    _nsys_db(path)
    s = summarize(path)
    assert s["num_steps"] == 3
    assert [st["gpu_busy_us"] for st in s["steps"]] == [90, 76, 48]
    assert [st["kernels"] for st in s["steps"]] == [2, 3, 2]
    assert [st["memcpys"] for st in s["steps"]] == [1, 1, 0]
    assert s["gaps_us"] == [10, 35]
    assert s["gpu_idle_fraction"] == pytest.approx(1 - 214 / 265)
    assert s["steps"][1]["syncs"] == 1 and s["steps"][1]["sync_us"] == 7
