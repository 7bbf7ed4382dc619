"""``cadence trace --profiler nsys``: the same command re-run under Nsight Systems, then read
back from its SQLite export.

The child runs ``cadence trace ... --profiler cuda-api``: its measured steps sit between
cudaProfilerStart and cudaProfilerStop (``nsys profile --capture-range=cudaProfilerApi``
records only them), each inside an NVTX ``engine_step`` range with the engine's phase ranges
nested; graph replays are traced per kernel node (Nsight's default is one range per graph).
The child writes its run description (load, model shape) next to the report; the
parent exports ``BASE.sqlite`` and reports on it. Nsight adds far less host time per op than
the torch profiler, but its records carry no tensor shapes: GEMM rows get no per-kernel floor,
and the GEMM class is floored by the model's weights.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


class NsysMissing(FileNotFoundError):
    """Nsight Systems is not on PATH (a user error: one line, exit status 2)."""


def commands(child_argv: list[str], base: Path, run_info: Path,
             python: str = sys.executable) -> list[list[str]]:
    """The profile and export command lines; options appended last override the user's."""
    child = [python, "-m", "cadence", "trace", *child_argv,
             "--profiler", "cuda-api", "--run-info-out", str(run_info)]
    return [
        ["nsys", "profile", "-t", "cuda,nvtx,osrt", "--cuda-graph-trace=node",
         "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "-o", str(base),
         "-f", "true", *child],
        ["nsys", "export", "-q", "-t", "sqlite", "-f", "true", "-o", f"{base}.sqlite",
         f"{base}.nsys-rep"],
    ]


def capture(child_argv: list[str], base: Path, run_info: Path) -> Path:
    """Run the child under nsys and export it; the SQLite export's path."""
    if shutil.which("nsys") is None:
        raise NsysMissing("Nsight Systems ('nsys') is not on PATH; use --profiler torch, or "
                          "install Nsight Systems")
    env = {**os.environ, "CADENCE_NVTX": "1"}
    base.parent.mkdir(parents=True, exist_ok=True)
    for cmd in commands(child_argv, base, run_info):
        subprocess.run(cmd, check=True, env=env)
    return Path(f"{base}.sqlite")
