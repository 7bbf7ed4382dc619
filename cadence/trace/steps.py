"""A trace as per-step records: host step ranges, phase ranges, host ops and GPU activities.

Input: a torch-profiler Chrome trace (``.json`` / ``.json.gz``), an Nsight Systems SQLite export
(``.sqlite``, see ``nsys_sqlite``), a trace dict or an event list. Steps are the host ranges
named ``engine_step``. A GPU activity (kernel, memcpy, memset) belongs to the step whose host
range contains the CUDA API call that launched it (matched by correlation id), so work launched
in step k and run after step k returned on the host still counts for step k; work launched
outside every step belongs to none. When the launch call is not in the trace (the torch profiler
keeps only some driver-API calls: graph launches through cuda-python are dropped), the host op
the activity is linked to ("External id") stands in for it; failing that, the activity takes the
step of the closest earlier linked activity on its stream. Traces with no links at all fall back
to GPU start times: an activity belongs to the last step that began before it. ``attribution``
counts the activities found each way.
"""

from __future__ import annotations

import bisect
import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadence.trace.nsys_sqlite import load_nsys_sqlite

STEP_NAME = "engine_step"
# cadence.profiling.PHASES, repeated so that reading a trace needs no torch.
PHASES = ("schedule", "prepare", "forward", "replay", "sample", "copy", "update")
# Named ranges that are not ops: left out of the host-op table (their ops are in it).
_RANGES = (*PHASES, "logits")
_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
_KIND = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy",
         "gpu_memset": "memset", "memset": "memset"}
_HOST_OP_CATS = ("cpu_op", "user_annotation")

# How a GPU activity found its step (the keys of the ``attribution`` figure).
BY_LAUNCH, BY_OP, BY_STREAM, BY_TIME = "launch", "op", "stream_order", "start_time"


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


@dataclass(frozen=True)
class Activity:
    """One GPU activity and the step that launched it (None: launched outside every step)."""

    name: str
    kind: str  # kernel, memcpy or memset
    start_us: float
    dur_us: float
    stream: str
    step: int | None
    external_id: int | None = None


@dataclass(frozen=True)
class HostRange:
    """A host event inside a step: an engine phase range or an outermost host op."""

    name: str
    start_us: float
    dur_us: float
    step: int
    tid: str
    shapes: tuple = ()  # the op's "Input Dims", when the profiler recorded shapes
    dtypes: tuple = ()  # its "Input type"


@dataclass
class ParsedTrace:
    steps: list[StepFigures]
    activities: list[Activity]
    phases: list[HostRange]
    ops: list[HostRange]
    attribution: dict[str, int]
    # Host ops by External id (name, shapes, dtypes): what a kernel's launching op was.
    op_by_id: dict[int, tuple[str, tuple, tuple]]

    @property
    def has_gpu(self) -> bool:
        return bool(self.activities)


def load_events(trace: str | Path | dict | list) -> list[dict]:
    """The complete ("X") events of a trace given as a path, a trace dict or an event list; a
    file that is no such trace is a ValueError naming it."""
    where = ""
    if isinstance(trace, (str, Path)):
        path = Path(trace)
        where = f"{path}: "
        if path.suffix in (".sqlite", ".db"):
            data: Any = load_nsys_sqlite(path)
        else:
            try:
                with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
                    data = json.load(f)
            except (UnicodeDecodeError, json.JSONDecodeError, gzip.BadGzipFile, EOFError) as exc:
                raise ValueError(f"{path} is not a trace in JSON (Chrome trace format): "
                                 f"{exc}") from None
    else:
        data = trace
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{where}a trace is a JSON object with a 'traceEvents' list, or a list "
                         f"of events; got {type(events).__name__}")
    return [e for e in events
            if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e and "dur" in e]


def category(event: dict) -> str:
    return str(event.get("cat") or "").lower()


def _is_gpu_side(cat: str) -> bool:
    # GPU activity and the GPU-timeline copies of host annotations (gpu_user_annotation).
    return cat in _GPU_CATS or cat.startswith("gpu_")


def _correlation(event: dict) -> int | None:
    value = (event.get("args") or {}).get("correlation")
    return int(value) if value is not None else None


def _external_id(event: dict) -> int | None:
    value = (event.get("args") or {}).get("External id")
    return int(value) if value else None  # 0 means "no linked op"


def _stream(event: dict) -> tuple[Any, Any]:
    args = event.get("args") or {}
    return args.get("device"), args.get("stream", event.get("tid"))


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
        (e for e in events if e.get("name") == step_name and not _is_gpu_side(category(e))),
        key=lambda e: float(e["ts"]),
    )
    return [StepFigures(i, float(e["ts"]), float(e["dur"])) for i, e in enumerate(marks)]


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
    return category(event) in ("cuda_runtime", "cuda_driver") and "Synchronize" in str(
        event.get("name", "")
    )


def _host_range(e: dict, step: int) -> HostRange:
    args = e.get("args") or {}
    # A tensor's dims are a list of ints; a tensor list's, a list of lists (no single shape).
    shapes = tuple(tuple(d) if isinstance(d, list) and all(isinstance(x, int) for x in d) else ()
                   for d in args.get("Input Dims") or ())
    dtypes = tuple(str(t) for t in args.get("Input type") or ())
    return HostRange(str(e.get("name")), float(e["ts"]), float(e["dur"]), step,
                     str(e.get("tid")), shapes, dtypes)


def _outermost(ops: list[HostRange]) -> list[HostRange]:
    """The ops not nested inside another op of their thread (their times do not overlap)."""
    out: list[HostRange] = []
    end_by_tid: dict[str, float] = {}
    for op in sorted(ops, key=lambda o: (o.tid, o.start_us, -o.dur_us)):
        if op.start_us < end_by_tid.get(op.tid, float("-inf")):
            continue
        out.append(op)
        end_by_tid[op.tid] = op.start_us + op.dur_us
    return sorted(out, key=lambda o: o.start_us)


def parse(trace: str | Path | dict | list, step_name: str = STEP_NAME) -> ParsedTrace:
    """Per-step records of a trace; raises ValueError without step ranges."""
    events = load_events(trace)
    steps = _steps(events, step_name)
    if not steps:
        raise ValueError(f"the trace has no host ranges named {step_name!r}")
    index = _StepIndex(steps)

    launch_ts: dict[int, float] = {}
    op_ts: dict[int, float] = {}
    op_by_id: dict[int, tuple[str, tuple, tuple]] = {}
    gpu_events: list[dict] = []
    phases: list[HostRange] = []
    ops: list[HostRange] = []
    for e in events:
        cat = category(e)
        if cat in _GPU_CATS:
            gpu_events.append(e)
            continue
        if _is_gpu_side(cat):
            continue
        corr = _correlation(e)
        if corr is not None:
            launch_ts[corr] = float(e["ts"])
        ext = _external_id(e)
        if ext is not None and cat in _HOST_OP_CATS:
            op_ts.setdefault(ext, float(e["ts"]))
        i = index.containing(float(e["ts"]))
        if i is None:
            continue
        name = e.get("name")
        if name in PHASES:
            phases.append(_host_range(e, i))
        elif cat == "cpu_op" and name not in _RANGES:
            op = _host_range(e, i)
            ops.append(op)
            if ext is not None:
                op_by_id[ext] = (op.name, op.shapes, op.dtypes)
        if _is_sync(e):
            steps[i].syncs += 1
            steps[i].sync_us += float(e["dur"])

    owners = _attribute(gpu_events, launch_ts, op_ts, index)
    attribution = {BY_LAUNCH: 0, BY_OP: 0, BY_STREAM: 0, BY_TIME: 0, "none": 0}
    activities: list[Activity] = []
    for e, (i, how) in zip(gpu_events, owners):
        attribution[how if i is not None and how is not None else "none"] += 1
        kind = _KIND[category(e)]
        start, dur = float(e["ts"]), float(e["dur"])
        stream = str(_stream(e)[1])
        activities.append(Activity(str(e.get("name")), kind, start, dur, stream, i,
                                   _external_id(e)))
        if i is None:
            continue
        step = steps[i]
        step.intervals.append((start, start + dur))
        step.kernels += kind == "kernel"
        step.memcpys += kind == "memcpy"
        step.memsets += kind == "memset"
    for step in steps:
        if step.intervals:
            step.gpu_busy_us = union_length(step.intervals)
            step.gpu_start_us = min(s for s, _ in step.intervals)
            step.gpu_end_us = max(e for _, e in step.intervals)
    phases.sort(key=lambda r: r.start_us)
    return ParsedTrace(steps, activities, phases, _outermost(ops), attribution, op_by_id)
