"""The report's pictures (matplotlib, PNG as base64): a timeline of a few steps and histograms
of the per-step figures."""

from __future__ import annotations

import base64
import io
from collections import Counter
from typing import Any

from cadence.trace.floors import op_class
from cadence.trace.steps import PHASES, ParsedTrace
from cadence.trace.summary import step_gaps

_PHASE_COLORS = dict(zip(PHASES, ("#a6cee3", "#fdbf6f", "#b2df8a", "#b2df8a", "#cab2d6",
                                  "#8dd3c7", "#ffed6f")))
_CLASS_COLORS = {"gemm": "#4e79a7", "attention": "#e15759", "norm": "#59a14f",
                 "memcpy": "#f28e2b", "memset": "#bab0ac", "other": "#9c755f"}
_GAP_COLOR = "#d62728"


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SystemExit("cadence trace needs matplotlib: pip install matplotlib") from exc
    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def stream_names(parsed: ParsedTrace) -> dict[str, str]:
    """``main`` for the stream with the most kernels, ``copy`` for streams of memcpys only."""
    kernels = Counter(a.stream for a in parsed.activities if a.kind == "kernel")
    names: dict[str, str] = {}
    main = kernels.most_common(1)[0][0] if kernels else None
    for stream in sorted({a.stream for a in parsed.activities}, key=lambda x: (x != main, x)):
        kinds = {a.kind for a in parsed.activities if a.stream == stream}
        if stream == main:
            names[stream] = f"GPU main (stream {stream})"
        elif kinds <= {"memcpy", "memset"}:
            names[stream] = f"GPU copy (stream {stream})"
        else:
            names[stream] = f"GPU stream {stream}"
    return names


def timeline_png(parsed: ParsedTrace, first: int = 0, count: int = 3) -> str:
    """Steps ``first`` .. ``first + count - 1``: host step ranges and phases above the GPU
    streams (kernels colored by class), idle gaps between steps shaded; CPU traces show the
    outermost host ops instead of streams."""
    plt = _plt()
    steps = parsed.steps[first:first + count]
    t0 = steps[0].host_start_us
    end = max(max(s.host_start_us + s.host_us, s.gpu_end_us or 0.0) for s in steps)
    chosen = {s.index for s in steps}
    rows: list[tuple[str, list[tuple[float, float, str]]]] = [
        ("host: engine_step", [(s.host_start_us, s.host_us, "#bbbbbb") for s in steps]),
        ("host: phases", [(r.start_us, r.dur_us, _PHASE_COLORS.get(r.name, "#888888"))
                          for r in parsed.phases if r.step in chosen]),
    ]
    if parsed.has_gpu:
        for stream, label in stream_names(parsed).items():
            acts = [a for a in parsed.activities if a.stream == stream and a.step in chosen]
            rows.append((label, [(a.start_us, a.dur_us, _CLASS_COLORS[
                op_class(a.name) if a.kind == "kernel" else a.kind]) for a in acts]))
    else:
        rows.append(("host: ops", [(o.start_us, o.dur_us, _CLASS_COLORS[op_class(o.name)])
                                   for o in parsed.ops if o.step in chosen]))
    fig, ax = plt.subplots(figsize=(12, 0.7 * len(rows) + 1.4))
    for y, (label, spans) in enumerate(reversed(rows)):
        edge = {"edgecolor": "white", "linewidth": 1.5} if label == rows[0][0] else {
            "linewidth": 0}  # back-to-back steps stay apart
        ax.broken_barh([((s - t0) / 1e3, max(d, 0.05) / 1e3) for s, d, _ in spans],
                       (y - 0.35, 0.7), facecolors=[c for _, _, c in spans], **edge)
    gpu_rows = len(rows) - 2
    for idx, start, stop in step_gaps(parsed):
        if idx in chosen and stop > start:
            ax.axvspan((start - t0) / 1e3, (stop - t0) / 1e3, ymax=gpu_rows / len(rows),
                       color=_GAP_COLOR, alpha=0.25)
    ax.set_yticks(range(len(rows)), [label for label, _ in reversed(rows)])
    ax.set_xlim(0, (end - t0) / 1e3 * 1.01)
    ax.set_xlabel(f"ms from the start of step {first}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _PHASE_COLORS.values()]
    labels = list(_PHASE_COLORS)
    classes = _CLASS_COLORS if parsed.has_gpu else {k: v for k, v in _CLASS_COLORS.items()
                                                   if not k.startswith("mem")}
    handles += [plt.Rectangle((0, 0), 1, 1, color=c) for c in classes.values()]
    labels += list(classes)
    if parsed.has_gpu:
        handles.append(plt.Rectangle((0, 0), 1, 1, color=_GAP_COLOR, alpha=0.25))
        labels.append("GPU idle gap")
    ax.legend(handles, labels, ncol=8, fontsize=8, loc="upper center",
              bbox_to_anchor=(0.5, -0.25 if len(rows) < 4 else -0.15), frameon=False)
    ax.set_title(f"steps {first}..{first + len(steps) - 1}")
    return _png(fig)


def histograms_png(summary: dict[str, Any]) -> str:
    """Per-step distributions: host time, GPU busy time, gaps, kernels and syncs per step."""
    plt = _plt()
    steps = summary["steps"]
    panels = [("host time per step (us)", [s["host_us"] for s in steps])]
    if summary["has_gpu"]:
        panels += [
            ("GPU busy per step (us)", [s["gpu_busy_us"] for s in steps
                                        if s["gpu_busy_us"] is not None]),
            ("GPU idle gap between steps (us)", summary["gaps_us"]),
            ("kernels per step", [s["kernels"] for s in steps]),
            ("host syncs per step", [s["syncs"] for s in steps]),
        ]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 2.8), squeeze=False)
    for ax, (title, values) in zip(axes[0], panels):
        if values:
            ax.hist(values, bins=min(20, max(len(set(values)), 1)), color="#4e79a7")
        else:
            ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("steps", fontsize=8)
    fig.tight_layout()
    return _png(fig)
