"""A trace report: its figures (JSON) and its HTML page (tables and pictures)."""

from __future__ import annotations

import html
from typing import Any

from cadence.trace.floors import ModelShape
from cadence.trace.kernels import class_table, kernel_table, reference_us, rows_json
from cadence.trace.plots import histograms_png, timeline_png
from cadence.trace.steps import ParsedTrace
from cadence.trace.summary import format_summary, summarize
from cadence.trace.template import PAGE


def build_figures(parsed: ParsedTrace, run: dict[str, Any] | None = None,
                  bandwidth: float | None = None, title: str = "cadence trace") -> dict[str, Any]:
    """Everything the report shows, as JSON-ready data (``--json-out``)."""
    run = run or {}
    shape = ModelShape.from_json(run.get("model_shape"))
    rows = kernel_table(parsed, shape, bandwidth, run.get("context_tokens"))
    return {
        "title": title,
        "run": run,
        "bandwidth_bytes_per_s": bandwidth,
        "reference": "gpu_busy_us" if parsed.has_gpu else "host_us",
        "reference_us_per_step": reference_us(parsed),
        "summary": summarize(parsed),
        "classes": class_table(rows, shape, bandwidth),
        "kernels": rows_json(rows),
        "rows_share": sum(r.share for r in rows),
    }


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "\u2013"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return html.escape(str(value))


def _table(headers: list[str], rows: list[list[str]], table_id: str) -> str:
    head = "".join(f'<th class="l">{h}</th>' if i < 2 else f"<th>{h}</th>"
                   for i, h in enumerate(headers))
    body = "\n".join("<tr>" + "".join(f'<td class="l">{c}</td>' if i < 2 else f"<td>{c}</td>"
                                      for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<table id="{table_id}"><tr>{head}</tr>\n{body}\n</table>'


def _pct(x: float | None) -> str:
    return "\u2013" if x is None else f"{x * 100:.1f}%"


def _kernel_rows(figures: dict[str, Any], max_rows: int) -> str:
    rows = [[f'<span title="{html.escape(r["full_name"])}">{html.escape(r["name"])}</span>',
             html.escape(r["op"]), _num(r["calls_per_step"], 2), _num(r["us_per_call"], 2),
             _num(r["us_per_step"]), _pct(r["share"]), _num(r["bytes_per_call"], 0),
             _num(r["gbps"]), _pct(r["ratio"])] for r in figures["kernels"][:max_rows]]
    rest = len(figures["kernels"]) - len(rows)
    more = f'<p class="note">{rest} shorter rows are in the JSON figures.</p>' if rest > 0 else ""
    return _table(["name", "op", "calls/step", "us/call", "us/step", "share", "bytes/call",
                   "GB/s", "of read BW"], rows, "kernels") + more


def _class_rows(figures: dict[str, Any]) -> str:
    rows = [[html.escape(c["class"]), html.escape(c["bytes_source"] or ""), str(c["kernels"]),
             _num(c["us_per_step"]), _pct(c["share"]), _num(c["bytes_per_step"], 0),
             _num(c["gbps"]), _pct(c["ratio"])] for c in figures["classes"]]
    return _table(["class", "bytes from", "rows", "us/step", "share", "bytes/step", "GB/s",
                   "of read BW"], rows, "classes")


def _compare_html(cmp: dict[str, Any] | None) -> str:
    if not cmp:
        return ""
    steps = [[html.escape(s["figure"]), "", _num(s["this"]), _num(s["other"]), _num(s["delta"])]
             for s in cmp["steps"]]
    kern = [[html.escape(r["name"]), html.escape(r["op"]), _num(r["this_us_per_step"]),
             _num(r["other_us_per_step"]), _num(r["delta_us_per_step"])] for r in cmp["kernels"]]
    return (f"<h2>Compared with {html.escape(cmp['other'])}</h2>"
            + _table(["figure", "", "this", "other", "delta"], steps, "compare-steps")
            + "<p class='note'>us per step, this run minus the other.</p>"
            + _table(["name", "op", "this", "other", "delta"], kern, "compare-kernels"))


def _description(figures: dict[str, Any]) -> str:
    run, bw = figures["run"], figures["bandwidth_bytes_per_s"]
    parts = []
    if run.get("load"):
        ld = run["load"]
        parts.append(f"{ld['kind']} load: batch {ld['batch']}, input {ld['input_len']} tokens, "
                     f"{ld['steps']} measured steps after {ld['warmup_steps']} warm-up steps; "
                     f"device {run.get('device_name')}, {run.get('dtype')}, "
                     f"async scheduling {run.get('async_scheduling')}, "
                     f"eager {run.get('enforce_eager')}; host clock "
                     f"{run.get('host_ms_per_step', 0):.3f} ms/step with the profiler attached.")
    parts.append(f"Read bandwidth for the floors: {bw / 1e12:.2f} TB/s." if bw else
                 "No read bandwidth given (--bandwidth): no ratios.")
    return html.escape(" ".join(parts))


def render_html(figures: dict[str, Any], parsed: ParsedTrace, timeline_steps: int = 3,
                max_rows: int = 100) -> str:
    gpu = parsed.has_gpu
    first = 1 if len(parsed.steps) > timeline_steps else 0  # the first step fills the pipeline
    note = ("share is of the mean GPU busy time per step; rows are kernels, memcpys and memsets "
            "launched in the measured steps." if gpu else
            "CPU-only trace: rows are the outermost host ops inside the steps; share is of the "
            "mean host time per step (the rest is Python between ops).")
    return PAGE.substitute(
        title=html.escape(figures["title"]),
        description=_description(figures),
        timeline=timeline_png(parsed, first, timeline_steps),
        lanes="GPU streams (kernels colored by class)" if gpu else "outermost host ops",
        gap_note=("GPU idle gaps between steps shaded red." if gpu else
                  "no GPU in this trace."),
        summary=html.escape(format_summary(figures["summary"])),
        histograms=histograms_png(figures["summary"]),
        classes=_class_rows(figures),
        kernel_note=html.escape(f"{note} The rows add up to {figures['rows_share'] * 100:.1f}%."),
        kernels=_kernel_rows(figures, max_rows),
        compare=_compare_html(figures.get("compare")),
    )
