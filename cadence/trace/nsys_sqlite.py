"""Reads an Nsight Systems SQLite export into Chrome-trace events that ``cadence.trace.steps`` understands.

Produce the export with ``nsys export --type sqlite -o run.sqlite run.nsys-rep`` (``nsys stats``
also writes one next to the report). Tables used, all optional (nsys creates them lazily):

- ``NVTX_EVENTS`` (start, end, text or textId -> StringIds, globalTid): push/pop and start/end
  ranges become host ``user_annotation`` events; ``engine_step`` marks the steps.
- ``CUPTI_ACTIVITY_KIND_RUNTIME`` (start, end, correlationId, nameId): CUDA runtime and driver
  calls become ``cuda_runtime`` events carrying ``args.correlation``.
- ``CUPTI_ACTIVITY_KIND_KERNEL`` / ``_MEMCPY`` / ``_MEMSET`` (start, end, correlationId):
  GPU activities, ``kernel`` / ``gpu_memcpy`` / ``gpu_memset``.

Timestamps are nanoseconds in the database and microseconds in the events.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

_GPU_TABLES = {
    "CUPTI_ACTIVITY_KIND_KERNEL": "kernel",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "gpu_memcpy",
    "CUPTI_ACTIVITY_KIND_MEMSET": "gpu_memset",
}
_API_TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER")


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f"PRAGMA table_info({table})")}


def _event(
    cat: str, name: str, start: int, end: int, tid: Any, corr: Any = None, stream: Any = None
) -> dict:
    event: dict[str, Any] = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": start / 1e3,
        "dur": (end - start) / 1e3,
        "pid": 0,
        "tid": tid,
    }
    args: dict[str, Any] = {}
    if corr is not None:
        args["correlation"] = int(corr)
    if stream is not None:
        args["stream"] = stream
    if args:
        event["args"] = args
    return event


def load_nsys_sqlite(path: str | Path) -> dict[str, list[dict]]:
    """``{"traceEvents": [...]}`` built from the export at ``path``."""
    con = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True)
    try:
        return {"traceEvents": _read(con)}
    finally:
        con.close()


def _read(con: sqlite3.Connection) -> list[dict]:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    strings: dict[int, str] = (
        dict(con.execute("SELECT id, value FROM StringIds")) if "StringIds" in tables else {}
    )
    events: list[dict] = []
    if "NVTX_EVENTS" in tables:
        cols = _columns(con, "NVTX_EVENTS")
        text_id = "textId" if "textId" in cols else "NULL"
        tid = "globalTid" if "globalTid" in cols else "0"
        rows = con.execute(
            f"SELECT start, end, text, {text_id}, {tid} FROM NVTX_EVENTS "
            "WHERE end IS NOT NULL AND end >= start"
        )
        for start, end, text, tid_value, thread in rows:
            name = text if text is not None else strings.get(tid_value)
            if name is not None:
                events.append(_event("user_annotation", name, start, end, thread))
    for table in _API_TABLES:
        if table not in tables:
            continue
        cols = _columns(con, table)
        name_col = "nameId" if "nameId" in cols else "NULL"
        tid = "globalTid" if "globalTid" in cols else "0"
        rows = con.execute(f"SELECT start, end, correlationId, {name_col}, {tid} FROM {table}")
        for start, end, corr, name_id, thread in rows:
            events.append(
                _event("cuda_runtime", strings.get(name_id, "cuda_api"), start, end, thread, corr)
            )
    for table, cat in _GPU_TABLES.items():
        if table not in tables:
            continue
        cols = _columns(con, table)
        name_col = next((c for c in ("shortName", "demangledName") if c in cols), "NULL")
        stream = "streamId" if "streamId" in cols else "0"
        rows = con.execute(f"SELECT start, end, correlationId, {name_col}, {stream} FROM {table}")
        for start, end, corr, name_id, stream_id in rows:
            name = strings.get(name_id, cat) if name_col != "NULL" else cat
            events.append(_event(cat, name, start, end, f"stream {stream_id}", corr, stream_id))
    return events
