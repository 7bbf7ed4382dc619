"""``cadence trace``: run N engine steps under the torch profiler (or read a trace made before,
e.g. an Nsight Systems SQLite export) and write a self-contained HTML report, its figures as
JSON, and the raw trace. The per-step summary of ``nsys/gaps.py`` is printed."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from cadence.bench.report import made_output_file
from cadence.cli_config import add_config_arg, parse_with_config
from cadence.trace.compare import compare, is_report
from cadence.trace.floors import default_bandwidth
from cadence.trace.load import LOADS, Load
from cadence.trace.report import build_figures, render_html
from cadence.trace.steps import STEP_NAME, parse
from cadence.trace.summary import format_summary
from cadence.user_errors import ArgumentParser

PROFILERS = ("torch", "nsys", "cuda-api")


def build_parser() -> argparse.ArgumentParser:
    from cadence.engine.engine_args import EngineArgs

    p = ArgumentParser(prog="cadence trace", description=__doc__)
    EngineArgs.add_cli_args(p)
    p.add_argument("--load", choices=LOADS, default="decode",
                   help="decode: a batch decodes; prefill: one prompt per step; mixed: the "
                        "decode batch plus one new prompt per step (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=1, help="decoding requests")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--steps", type=int, default=20, help="measured engine steps")
    p.add_argument("--warmup-steps", type=int, default=5, help="unrecorded steps first")
    p.add_argument("--profiler", choices=PROFILERS, default="torch",
                   help="torch: the torch profiler (shapes, so per-GEMM floors); nsys: this "
                        "command re-run under Nsight Systems (less overhead); cuda-api: only "
                        "bracket the steps for an outer nsys, writing no report")
    p.add_argument("--run-info-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dry-run", action="store_true",
                   help="with --profiler nsys: print the nsys commands only")
    p.add_argument("--from-trace", default=None,
                   help="report on this trace (.json/.json.gz/.sqlite) instead of running")
    p.add_argument("--step-name", default=STEP_NAME, help="host range that marks one step")
    p.add_argument("--out", default="trace.html", help="the HTML report")
    p.add_argument("--trace-out", default=None,
                   help="the raw Chrome trace (default: the report's name, .trace.json)")
    p.add_argument("--json-out", default=None, help="the report's figures as JSON")
    p.add_argument("--compare", default=None, metavar="OTHER.json",
                   help="the --json-out of another run, shown side by side")
    p.add_argument("--bandwidth", type=float, default=None,
                   help="device read bandwidth in TB/s for the byte floors (default: the spec "
                        "of a known GPU, e.g. 4.8 for an H200; none on CPU)")
    p.add_argument("--title", default=None)
    p.add_argument("--timeline-steps", type=int, default=3, help="steps in the timeline picture")
    p.add_argument("--max-rows", type=int, default=100,
                   help="kernel rows in the page (all of them are in the JSON)")
    return p


def _bandwidth(ns: argparse.Namespace, run: dict[str, Any]) -> float | None:
    if ns.bandwidth is not None:
        return ns.bandwidth * 1e12
    return default_bandwidth(run.get("device_name", "")) if run.get("device") == "cuda" else None


def _run(ns: argparse.Namespace, trace_path: Path | None) -> dict[str, Any]:
    from cadence.engine.engine_args import EngineArgs
    from cadence.trace.load import trace_load

    load = Load(ns.load, ns.batch_size, ns.input_len, ns.steps, ns.warmup_steps, ns.seed)
    profiler = "torch" if ns.profiler == "torch" else "cuda-api"
    return trace_load(EngineArgs.from_cli_args(ns), load, trace_path, profiler)


def report(ns: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Run (or read) the trace, write the report files and return the figures."""
    # Every check that needs no trace comes before the run (which may take minutes).
    if ns.timeline_steps < 1 or ns.max_rows < 1:
        raise ValueError("--timeline-steps and --max-rows must be at least 1")
    if ns.bandwidth is not None and not 0 < ns.bandwidth < math.inf:
        raise ValueError(f"--bandwidth must be a positive number of TB/s, got {ns.bandwidth}")
    other = None
    if ns.compare:
        try:
            other = json.loads(Path(ns.compare).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--compare {ns.compare}: {exc}") from None
        if not is_report(other):
            raise ValueError(f"--compare {ns.compare}: not the --json-out of a cadence trace "
                             "(a 'summary' and a 'kernels' list are needed).")
    if ns.from_trace and not Path(ns.from_trace).is_file():
        raise ValueError(f"--from-trace: no file {ns.from_trace!r}")
    for flag, path in (("--out", ns.out), ("--json-out", ns.json_out),
                       ("--trace-out", None if ns.from_trace else ns.trace_out)):
        if path is not None:
            made_output_file(flag, str(path))
    out = Path(ns.out)
    run: dict[str, Any] = {}
    if ns.from_trace:
        trace_path = Path(ns.from_trace)
    elif ns.profiler == "nsys":
        from cadence.trace import nsight

        base = out.with_suffix("")
        info = Path(f"{base}.run.json")
        trace_path = nsight.capture(argv, base, info)
        run = json.loads(info.read_text())
    else:
        trace_path = Path(ns.trace_out or out.with_suffix(".trace.json"))
        run = _run(ns, trace_path)
    parsed = parse(trace_path, ns.step_name)
    title = ns.title or (f"cadence trace: {run['load']['kind']} batch {run['load']['batch']}"
                         if run else f"cadence trace: {trace_path.name}")
    figures = build_figures(parsed, run, _bandwidth(ns, run), title)
    figures["trace"] = str(trace_path)
    if other is not None:
        figures["compare"] = compare(figures, other)
    out.write_text(render_html(figures, parsed, ns.timeline_steps, ns.max_rows))
    if ns.json_out:
        Path(ns.json_out).write_text(json.dumps(figures, indent=1) + "\n")
    return figures


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    add_config_arg(parser)
    # NOTE: argv stays as given: the nsys child re-reads the same --config file.
    ns = parse_with_config(parser, argv)
    if ns.profiler == "nsys" and ns.dry_run:
        from cadence.trace.nsight import commands

        base = Path(ns.out).with_suffix("")
        child = [a for a in argv if a != "--dry-run"]
        for cmd in commands(child, base, Path(f"{base}.run.json")):
            print("CADENCE_NVTX=1 " + shlex.join(cmd) if cmd[1] == "profile" else shlex.join(cmd))
        return 0
    if ns.profiler == "cuda-api":  # the child of --profiler nsys: run, describe, no report
        run = _run(ns, None)
        if ns.run_info_out:
            Path(ns.run_info_out).write_text(json.dumps(run, indent=1) + "\n")
        print(f"measured {run['load']['steps']} steps, {run['host_ms_per_step']:.3f} ms/step")
        return 0
    figures = report(ns, argv)
    print(format_summary(figures["summary"]))
    print(f"report: {ns.out}  trace: {figures['trace']}"
          + (f"  figures: {ns.json_out}" if ns.json_out else ""))
    return 0
