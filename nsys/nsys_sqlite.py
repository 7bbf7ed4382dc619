"""Reads an Nsight Systems SQLite export into Chrome-trace events (``cadence.trace.nsys_sqlite``)."""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadence.trace.nsys_sqlite import load_nsys_sqlite  # noqa: E402

__all__ = ["load_nsys_sqlite"]
