"""The per-kernel table: calls, time and share of the step per kernel, and its byte floor.

On a CUDA trace the rows are GPU activities (kernels, memcpys, memsets) of the measured steps,
and a row's share is of the mean GPU busy time per step. On a CPU-only trace the rows are the
outermost host ops inside the steps (``aten::linear``, ``aten::mul`` ...), and a row's share is
of the mean host time per step. Rows are grouped by shortened name and layer op (a GEMM's op
carries its shape, so one kernel name run at several shapes gives several rows).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from cadence.trace.floors import GEMM, ModelShape, floor_of, op_class
from cadence.trace.steps import ParsedTrace

_GENERIC_KERNEL = re.compile(r"(^|::)(Kernel\d*|kernel)$")


def short_name(name: str, limit: int = 64) -> str:
    """A kernel name without return type, template arguments and parameters (a generic
    ``Kernel<...>`` keeps its first template argument)."""
    s = re.sub(r"^void\s+", "", name.strip())
    # A parameter list follows the name directly; "Memcpy DtoH (Device -> Pinned)" keeps its own.
    base = re.split(r"<|(?<=\S)\(", s, maxsplit=1)[0]
    if _GENERIC_KERNEL.search(base) and s[len(base):].startswith("<"):
        base += "<" + re.split(r"[,<>(]", s[len(base) + 1:], maxsplit=1)[0] + ">"
    return base if len(base) <= limit else base[: limit - 1] + "\u2026"


@dataclass(frozen=True)
class KernelRow:
    name: str
    full_name: str
    cls: str  # gemm, attention, norm, memcpy, memset, other
    op: str  # the layer op (a GEMM's layer and shape) or the class
    calls_per_step: float
    us_per_call: float
    us_per_step: float
    share: float
    bytes_per_call: float | None
    gbps: float | None
    ratio: float | None  # achieved bandwidth / the device's read bandwidth


@dataclass
class _Acc:
    full_name: str
    cls: str
    calls: int = 0
    us: float = 0.0
    bytes_per_call: float | None = None


def _calls(parsed: ParsedTrace, shape: ModelShape | None, context_tokens: float | None):
    """(name, class, duration, floor) of every call inside a measured step."""
    if parsed.has_gpu:
        for a in parsed.activities:
            if a.step is None:
                continue
            cls = op_class(a.name) if a.kind == "kernel" else a.kind
            host = parsed.op_by_id.get(a.external_id) if a.external_id is not None else None
            op, shapes, dtypes = host if host else (None, (), ())
            yield a.name, cls, a.dur_us, floor_of(a.name, cls, op, shapes, dtypes, shape,
                                                  context_tokens)
        return
    for o in parsed.ops:
        cls = op_class(o.name)
        yield o.name, cls, o.dur_us, floor_of(o.name, cls, o.name, o.shapes, o.dtypes, shape,
                                              context_tokens)


def reference_us(parsed: ParsedTrace) -> float:
    """Per step: mean GPU busy time (CUDA trace) or mean host time (CPU trace)."""
    n = len(parsed.steps)
    if parsed.has_gpu:
        return sum(s.gpu_busy_us or 0.0 for s in parsed.steps) / n
    return sum(s.host_us for s in parsed.steps) / n


def kernel_table(parsed: ParsedTrace, shape: ModelShape | None = None,
                 bandwidth: float | None = None,
                 context_tokens: float | None = None) -> list[KernelRow]:
    """Rows sorted by time per step, longest first; ``bandwidth`` in bytes/s."""
    groups: dict[tuple[str, str], _Acc] = {}
    for name, cls, dur, floor in _calls(parsed, shape, context_tokens):
        acc = groups.setdefault((short_name(name), floor.op), _Acc(name, cls))
        acc.calls += 1
        acc.us += dur
        acc.bytes_per_call = floor.bytes
    n = len(parsed.steps)
    ref = reference_us(parsed)
    rows = []
    for (name, op), acc in groups.items():
        per_call = acc.us / acc.calls
        gbps = acc.bytes_per_call / per_call / 1e3 if acc.bytes_per_call and per_call > 0 else None
        ratio = gbps * 1e9 / bandwidth if gbps is not None and bandwidth else None
        rows.append(KernelRow(name, acc.full_name, acc.cls, op, acc.calls / n, per_call,
                              acc.us / n, acc.us / n / ref if ref > 0 else 0.0,
                              acc.bytes_per_call, gbps, ratio))
    return sorted(rows, key=lambda r: (-r.us_per_step, r.name, r.op))


def class_table(rows: list[KernelRow], shape: ModelShape | None = None,
                bandwidth: float | None = None) -> list[dict[str, Any]]:
    """Per class: time per step, and the bytes per step of its rows with a floor, with the
    GB/s over those rows' time. GEMMs of which no row has a floor (graph replays carry no
    shapes) take the model's linear weights, read once per step, over all GEMM time."""
    out = []
    for cls in sorted({r.cls for r in rows}):
        members = [r for r in rows if r.cls == cls]
        us = sum(r.us_per_step for r in members)
        floored = [r for r in members if r.bytes_per_call is not None]
        nbytes: float | None = None
        floored_us, source = 0.0, None
        if floored:
            nbytes = sum(r.bytes_per_call * r.calls_per_step for r in floored)
            floored_us = sum(r.us_per_step for r in floored)
            source = f"{len(floored)} of {len(members)} rows"
        elif cls == GEMM and shape is not None and shape.linears:
            nbytes, floored_us, source = float(shape.weight_bytes), us, "model weights"
        gbps = nbytes / floored_us / 1e3 if nbytes and floored_us > 0 else None
        out.append({"class": cls, "kernels": len(members), "us_per_step": us,
                    "share": sum(r.share for r in members), "bytes_per_step": nbytes,
                    "floored_us_per_step": floored_us, "bytes_source": source, "gbps": gbps,
                    "ratio": gbps * 1e9 / bandwidth if gbps is not None and bandwidth else None})
    return sorted(out, key=lambda c: -c["us_per_step"])


def rows_json(rows: list[KernelRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
