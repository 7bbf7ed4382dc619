"""An Nsight Systems export read into Chrome-trace events: driver-API launches, memsets,
streams and threads, nanoseconds to microseconds."""

from __future__ import annotations

import sqlite3

from cadence.trace.nsys_sqlite import load_nsys_sqlite
from cadence.trace.steps import parse


def _db(path) -> None:
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE NVTX_EVENTS (start INT, end INT, text TEXT, textId INT, globalTid INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_DRIVER (start INT, end INT, correlationId INT,
                                                 nameId INT, globalTid INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, correlationId INT,
                                                 shortName INT, streamId INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INT, end INT, correlationId INT,
                                                 streamId INT);
        INSERT INTO StringIds VALUES (1, 'engine_step'), (2, 'cuLaunchKernel'), (3, 'gemm');
        INSERT INTO NVTX_EVENTS VALUES (0, 100000, NULL, 1, 77);
        INSERT INTO CUPTI_ACTIVITY_KIND_DRIVER VALUES (10000, 11000, 5, 2, 77);
        INSERT INTO CUPTI_ACTIVITY_KIND_DRIVER VALUES (12000, 12500, 6, 2, 77);
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (120000, 130000, 5, 3, 7);
        INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (130000, 132000, 6, 9);
        """
    )
    con.commit()
    con.close()


def test_driver_launches_memsets_streams_and_threads(tmp_path) -> None:
    db = tmp_path / "run.sqlite"
    _db(db)
    events = sorted(load_nsys_sqlite(db)["traceEvents"], key=lambda e: e["ts"])
    base = {"ph": "X", "pid": 0}
    assert events == [
        {**base, "cat": "user_annotation", "name": "engine_step", "ts": 0, "dur": 100, "tid": 77},
        {**base, "cat": "cuda_runtime", "name": "cuLaunchKernel", "ts": 10, "dur": 1, "tid": 77,
         "args": {"correlation": 5}},
        {**base, "cat": "cuda_runtime", "name": "cuLaunchKernel", "ts": 12, "dur": 0.5,
         "tid": 77, "args": {"correlation": 6}},
        {**base, "cat": "kernel", "name": "gemm", "ts": 120, "dur": 10, "tid": "stream 7",
         "args": {"correlation": 5, "stream": 7}},
        {**base, "cat": "gpu_memset", "name": "gpu_memset", "ts": 130, "dur": 2,
         "tid": "stream 9", "args": {"correlation": 6, "stream": 9}},
    ]
    # Both were launched inside the step (through the driver API), though they ran after it.
    parsed = parse(db)
    (step,) = parsed.steps
    assert (step.kernels, step.memsets, step.gpu_busy_us) == (1, 1, 12)
