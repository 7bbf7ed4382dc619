"""docs/runtime.md's examples run as they are written.

Each fenced block is tagged: ``python cpu`` (the CPU backend, or a CUDA device where there is
one), ``python sim`` (Numba's CUDA simulator, in a subprocess), ``python gpu`` (a CUDA device);
``needs=MODULE`` skips a block whose optional module is absent. Blocks of one tag run in order
in one namespace, as a reader would type them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "runtime.md"
_FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks(tag: str) -> list[tuple[str, list[str]]]:
    """(code, needed modules) of every block tagged ``tag``, in order."""
    out = []
    for m in _FENCE.finditer(DOC.read_text()):
        words = m.group(1).split()
        if words and words[0] == tag:
            needs = [w.split("=", 1)[1] for w in words[1:] if w.startswith("needs=")]
            out.append((m.group(2), needs))
    return out


def test_every_python_block_is_tagged() -> None:
    tags = [m.group(1).split()[:1] for m in _FENCE.finditer(DOC.read_text())]
    assert tags and all(t and t[0] in ("cpu", "sim", "gpu") for t in tags), tags
    assert len(blocks("cpu")) >= 6 and blocks("sim") and len(blocks("gpu")) >= 6


def _run_in_order(tag: str) -> None:
    namespace: dict = {"__name__": f"runtime_doc_{tag}"}
    for i, (code, needs) in enumerate(blocks(tag)):
        if any(importlib.util.find_spec(n) is None for n in needs):
            continue
        exec(compile(code, f"{DOC}:{tag}-block-{i}", "exec"), namespace)  # noqa: S102


def test_cpu_blocks() -> None:
    _run_in_order("cpu")


def test_sim_blocks() -> None:
    pytest.importorskip("numba")
    code = "\n".join(c for c, _ in blocks("sim"))
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.gpu
def test_gpu_blocks() -> None:
    _run_in_order("gpu")
