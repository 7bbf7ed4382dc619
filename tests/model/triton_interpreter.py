"""Running Triton kernels on the CPU through Triton's interpreter, in a subprocess.

The interpreter mode is process-wide (``TRITON_INTERPRET=1`` before triton is imported), so a
test module that wants it runs itself as a script: its ``__main__`` block sets the variable,
calls ``patch_interpreter()`` and runs its CPU cases; ``run_interpreted(__file__)`` is the
pytest side.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

DONE = "interpreted cases ok"


def run_interpreted(path: str, timeout: float = 600) -> None:
    """Run ``path`` as a script under Triton's interpreter; it must print ``DONE``."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    import torch

    if torch.cuda.is_available():
        pytest.skip("the GPU tests run the compiled kernels")
    proc = subprocess.run(
        [sys.executable, path], capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, TRITON_INTERPRET="1"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert DONE in proc.stdout


def patch_interpreter() -> None:
    """Triton 3.6's interpreter holds scalars as 1-element arrays and turns them into loop
    bounds with ``int(array)``, which numpy >= 2.4 refuses for arrays that are not 0-d."""
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).flat[0]))

    interpreter._patch_lang_tensor = patched
