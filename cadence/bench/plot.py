"""Latency percentiles of ``cadence bench serve`` runs as a picture (matplotlib)."""

from __future__ import annotations

from typing import Any

METRICS = (
    ("ttft", "time to first token"),
    ("tpot", "time per output token"),
    ("itl", "inter-token latency"),
)
PERCENTILES = (50, 90, 99)


def run_label(report: dict[str, Any]) -> str:
    rate = report.get("request_rate", "inf")
    conc = report.get("concurrency")
    parts = [f"{rate} req/s" if rate != "inf" else "all at once"]
    if conc:
        parts.append(f"max {conc} in flight")
    return ", ".join(parts)


def plot_latency(reports: list[dict[str, Any]], path: str) -> None:
    """One panel per metric; per run, its p50 / p90 / p99 (ms) as grouped bars."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from exc
    fig, axes = plt.subplots(1, len(METRICS), figsize=(5 * len(METRICS), 4.2), squeeze=False)
    labels = [run_label(r) for r in reports]
    width = 0.8 / len(PERCENTILES)
    for ax, (metric, title) in zip(axes[0], METRICS, strict=True):
        for i, p in enumerate(PERCENTILES):
            values = [r.get(f"p{p}_{metric}_ms", 0.0) for r in reports]
            xs = [j + (i - 1) * width for j in range(len(reports))]
            ax.bar(xs, values, width, label=f"p{p}")
        ax.set_title(title)
        ax.set_ylabel("ms")
        ax.set_xticks(range(len(reports)), labels, rotation=20, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend()
    first = reports[0] if reports else {}
    fig.suptitle(
        f"cadence bench serve: {first.get('model', '')}, {first.get('input_len', '')} in / "
        f"{first.get('output_len', '')} out, commit {first.get('commit', '')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
