"""The FP8 weight-only GEMM kernel against float64, split-K included.

On a GPU the compiled kernel runs (tests/model/test_fp8.py has the GPU cases of both FP8
kernels); without one, when triton is installed, these cases run through Triton's interpreter in
a subprocess (``python tests/model/test_fp8_kernels.py`` with ``TRITON_INTERPRET=1``). The
interpreter runs a launch's programs one after another, so it checks the split-K arithmetic and
the counters' re-arming, not the ordering between concurrent programs (the GPU cases do).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":  # the interpreter driver: before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402
import torch  # noqa: E402

from cadence.model.fp8 import quantize_rows  # noqa: E402
from tests.model.triton_interpreter import DONE, patch_interpreter, run_interpreted  # noqa: E402

SHAPES = [(1, 96, 64), (3, 100, 200), (16, 64, 512), (5, 33, 1000)]


def run_weight_only(device: str, dtype: torch.dtype, f16_only: bool = False) -> None:
    from cadence.model.fp8_kernels import WeightOnlyConfig, weight_only_linear
    from cadence.model.skinny_gemm_kernels import arrival_counters

    gen = torch.Generator().manual_seed(0)
    configs = [WeightOnlyConfig(32, 64, 4, 1, 1), WeightOnlyConfig(16, 32, 4, 1, 4),
               WeightOnlyConfig(32, 128, 4, 1, 3), WeightOnlyConfig(16, 64, 4, 1, 8),
               WeightOnlyConfig(16, 64, 4, 1, 1, True), WeightOnlyConfig(32, 128, 4, 1, 4, True)]
    # f16 products (bf16 and f16 activations only; float32 ignores the flag).
    f16 = [WeightOnlyConfig(32, 64, 4, 1, 1, f16=True), WeightOnlyConfig(16, 64, 4, 1, 4, f16=True)]
    configs = f16 if f16_only else configs + f16
    for m, n, k in SHAPES:
        w = torch.randn(n, k, generator=gen)
        x = torch.randn(m, k, generator=gen)
        wq, ws = quantize_rows(w)
        want = (x.double() @ wq.double().T) * ws.double()
        for cfg in configs:
            for _ in range(2):  # the second launch finds the counters re-armed
                got = weight_only_linear(x.to(device, dtype), wq.to(device), ws.to(device), cfg)
                assert got.dtype == dtype and got.shape == (m, n)
                rel = float((got.double().cpu() - want).norm() / want.norm())
                assert rel < (1e-6 if dtype == torch.float32 else 8e-3), (m, n, k, cfg, rel)
    assert int(arrival_counters(torch.device(device)).abs().sum()) == 0


@pytest.mark.timeout(600)  # the interpreter's subprocess, minutes on 2 cores
def test_weight_only_kernel_in_triton_interpreter() -> None:
    run_interpreted(__file__)


if __name__ == "__main__":
    patch_interpreter()
    run_weight_only("cpu", torch.float32)
    run_weight_only("cpu", torch.bfloat16, f16_only=True)
    print(DONE)
