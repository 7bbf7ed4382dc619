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


def run_interpreted(path: str, timeout: float = 600, args: tuple[str, ...] = ()) -> None:
    """Run ``path`` as a script (with ``args``) under Triton's interpreter; it must print
    ``DONE``."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    import torch

    if torch.cuda.is_available():
        pytest.skip("the GPU tests run the compiled kernels")
    proc = subprocess.run(
        [sys.executable, path, *args], capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, TRITON_INTERPRET="1"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert DONE in proc.stdout


def patch_interpreter() -> None:
    """Two fixes to Triton 3.6's interpreter.

    It holds scalars as 1-element arrays and turns them into loop bounds with ``int(array)``,
    which numpy >= 2.4 refuses for arrays that are not 0-d.

    Its float -> e4m3 (``float8e4nv``) conversion is not the GPU's (``cvt.rn.satfinite``, round
    to nearest even): a mantissa that rounds up past 7 is OR-ed into the exponent instead of
    carried, so a value just under a power of two whose exponent field is odd comes out halved
    (1.97 -> 1.0, -7.9 -> -4.0, ~2% of random values); subnormal results are truncated toward
    zero and ties round away from zero. Such conversions here round as the GPU does."""
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).flat[0]))

    interpreter._patch_lang_tensor = patched
    if not getattr(interpreter._convert_float, "rounds_e4m3_as_the_gpu", False):
        interpreter._convert_float = _e4m3_as_the_gpu(interpreter._convert_float)


def _e4m3_as_the_gpu(convert):  # type: ignore[no-untyped-def]
    """``convert`` (the interpreter's ``_convert_float``) with float32/16 and bfloat16 -> e4m3
    rounded to nearest even and saturated to +-448 (NaN stays NaN), as on the GPU."""
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    sources = {tl.float32: (np.int32, torch.float32), tl.float16: (np.int16, torch.float16),
               tl.bfloat16: (np.int16, torch.bfloat16)}

    def patched(input, input_dtype, output_dtype, rounding_mode):  # type: ignore[no-untyped-def]
        source = sources.get(input_dtype)
        if (output_dtype != tl.float8e4nv or source is None
                or rounding_mode != interpreter._ir.ROUNDING_MODE.RTNE):
            return convert(input, input_dtype, output_dtype, rounding_mode)
        bits, dtype = source
        x = torch.from_numpy(np.ascontiguousarray(input).view(bits).copy()).view(dtype)
        e4m3 = x.float().clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return e4m3.view(torch.uint8).numpy().reshape(np.shape(input))

    patched.rounds_e4m3_as_the_gpu = True  # type: ignore[attr-defined]
    return patched
