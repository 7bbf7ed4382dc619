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


def _run_as_script(tag: str, path: Path, **env: str) -> None:
    """The blocks of ``tag`` as one script file (Numba compiles kernels from real source files)."""
    code = "\n".join(c for c, needs in blocks(tag)
                     if all(importlib.util.find_spec(n) is not None for n in needs))
    path.write_text(code)
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, **env, PYTHONPATH=os.pathsep.join(paths))
    proc = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_sim_blocks(tmp_path) -> None:
    pytest.importorskip("numba")
    _run_as_script("sim", tmp_path / "runtime_doc_sim.py", NUMBA_ENABLE_CUDASIM="1")


@pytest.mark.gpu
def test_gpu_blocks(tmp_path) -> None:
    _run_as_script("gpu", tmp_path / "runtime_doc_gpu.py")
