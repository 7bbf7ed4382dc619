"""Per-step host and GPU figures from a trace: GPU busy time, idle gaps, kernels per step.

The figures are computed by ``cadence.trace.summary`` (definitions there; steps and the
attribution of GPU work to them in ``cadence.trace.steps``); this script prints them. Input: a
torch-profiler Chrome trace (``.json`` or ``.json.gz``, as written by ``nsys/torch_trace.py``) or
an Nsight Systems SQLite export (``.sqlite``, from ``nsys export --type sqlite``). Reading a trace
needs numpy, not torch. ``cadence trace`` draws the same figures as an HTML report.

Usage: ``python nsys/gaps.py TRACE [--json] [--step-name engine_step]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadence.trace.steps import PHASES, STEP_NAME, load_events, union_length  # noqa: E402
from cadence.trace.summary import format_summary, stats, summarize  # noqa: E402

__all__ = ["PHASES", "STEP_NAME", "format_summary", "load_events", "main", "stats", "summarize",
           "union_length"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nsys/gaps.py", description=__doc__.splitlines()[0])
    p.add_argument("trace", help="torch-profiler Chrome trace (.json/.json.gz) or nsys .sqlite")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--step-name", default=STEP_NAME, help="host range that marks one step")
    ns = p.parse_args(argv)
    try:
        summary = summarize(ns.trace, ns.step_name)
    except (ValueError, OSError) as exc:  # not a trace; no such file, a folder, unreadable
        print(f"gaps.py: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=1) if ns.json else format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
