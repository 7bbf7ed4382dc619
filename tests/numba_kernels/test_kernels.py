"""The Numba kernels themselves: under the CUDA simulator (CPU, in a subprocess so that the
simulator does not leak into other tests) and on a real GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

DRIVER = Path(__file__).with_name("_sim_driver.py")


def test_kernels_match_reference_in_simulator() -> None:
    pytest.importorskip("numba.cuda")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run(
        [sys.executable, str(DRIVER)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok 8 simulated cases" in proc.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(6))
def test_kernels_match_reference_on_gpu(seed: int) -> None:
    import torch
    from numba import cuda

    from cadence.numba_kernels import kernels
    from tests.numba_kernels.batches import combine_loop, random_batch, scatter_loop

    b = random_batch(np.random.default_rng(seed), rows=300, max_reqs=512)
    d = {k: torch.from_numpy(v.copy()).cuda() for k, v in vars(b).items()}
    v = {k: cuda.as_cuda_array(t) for k, t in d.items()}
    blocks = -(-300 // kernels.THREADS_PER_BLOCK)
    kernels.combine_kernel[blocks, kernels.THREADS_PER_BLOCK](
        v["input_ids"], v["last_sampled"], v["req_indices"], v["last_token_index"],
        v["use_sampled"], v["count"],
    )  # fmt: skip
    kernels.scatter_kernel[blocks, kernels.THREADS_PER_BLOCK](
        v["sampled"], v["req_indices"], v["last_sampled"], v["count"]
    )
    cuda.synchronize()
    np.testing.assert_array_equal(d["input_ids"].cpu().numpy(), combine_loop(b))
    np.testing.assert_array_equal(d["last_sampled"].cpu().numpy(), scatter_loop(b))
