"""Two runs side by side: step figures and per-kernel time, this run against another's JSON."""

from __future__ import annotations

from typing import Any

_STEP_FIGURES = ("host_us", "gpu_busy_us", "gap_us")


def _p50(summary: dict[str, Any], key: str) -> float | None:
    value = summary.get(key)
    return value["p50"] if value else None


def _delta(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def is_report(figures: Any) -> bool:
    """Whether ``figures`` (a JSON document) has what ``compare`` reads of a run."""
    if not isinstance(figures, dict) or not isinstance(figures.get("summary"), dict):
        return False
    if not all(value is None or (isinstance(value, dict) and isinstance(
            value.get("p50"), int | float | None)) for key, value in figures["summary"].items()
            if key in _STEP_FIGURES):
        return False
    kernels = figures.get("kernels")
    return isinstance(kernels, list) and all(
        isinstance(r, dict) and isinstance(r.get("name"), str) and isinstance(r.get("op"), str)
        and isinstance(r.get("us_per_step"), int | float) for r in kernels)


def compare(this: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Deltas are this minus other: p50 step figures, and us per step of every kernel row
    (matched by name and op; a row in one run only counts 0 in the other)."""
    steps = []
    for key in _STEP_FIGURES:
        a, b = _p50(this["summary"], key), _p50(other["summary"], key)
        steps.append({"figure": f"{key} p50", "this": a, "other": b, "delta": _delta(a, b)})
    mine = {(r["name"], r["op"]): r for r in this["kernels"]}
    theirs = {(r["name"], r["op"]): r for r in other["kernels"]}
    rows = []
    for key in sorted(mine.keys() | theirs.keys()):
        a = mine[key]["us_per_step"] if key in mine else 0.0
        b = theirs[key]["us_per_step"] if key in theirs else 0.0
        rows.append({"name": key[0], "op": key[1], "this_us_per_step": a,
                     "other_us_per_step": b, "delta_us_per_step": a - b})
    rows.sort(key=lambda r: -abs(r["delta_us_per_step"]))
    return {"other": other.get("title", "other run"), "steps": steps, "kernels": rows}
