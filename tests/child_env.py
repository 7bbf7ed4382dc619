"""The environment of a Python child process a test starts: this checkout's cadence first on
its path, and whatever the caller's PYTHONPATH adds (a GPU machine's wheels live there) kept."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python_path(*first: str | Path) -> str:
    paths = [*map(str, first), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return os.pathsep.join(paths)


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": python_path(), **extra}
