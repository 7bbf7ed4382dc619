"""Runs the Numba kernels under the CUDA simulator; started in a subprocess by test_kernels_sim.

Exits non-zero (with the failing case on stderr) when a kernel disagrees with the semantics.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from cadence.numba_kernels.launcher import NumbaTokenKernels  # noqa: E402
from tests.numba_kernels.batches import (  # noqa: E402
    combine_loop,
    load_batch,
    random_batch,
    scatter_loop,
    token_buffers,
)


def check_launcher(seed: int, use_dtype: type) -> None:
    rng = np.random.default_rng(seed)
    b = random_batch(rng, rows=40, max_reqs=50, use_dtype=use_dtype)
    want_ids, want_last = combine_loop(b), scatter_loop(b)
    bufs = token_buffers(b)
    kernels = NumbaTokenKernels(bufs, threads_per_block=16)  # several blocks
    assert kernels.simulator and kernels.blocks == 3
    kernels.combine()
    np.testing.assert_array_equal(bufs.input_ids.numpy(), want_ids, err_msg=f"combine {seed}")
    kernels.scatter()
    np.testing.assert_array_equal(bufs.last_sampled.numpy(), want_last, err_msg=f"scatter {seed}")
    # The same views serve a later step: new contents and count, no rebuild.
    b2 = random_batch(rng, rows=40, max_reqs=50, use_dtype=use_dtype)
    load_batch(bufs, b2)
    kernels.combine()
    kernels.scatter()
    np.testing.assert_array_equal(bufs.input_ids.numpy(), combine_loop(b2), err_msg=f"2: {seed}")
    np.testing.assert_array_equal(bufs.last_sampled.numpy(), scatter_loop(b2), err_msg=f"2: {seed}")


def main() -> int:
    cases = 0
    for seed in range(8):
        check_launcher(seed, np.int32 if seed % 2 else np.int8)
        cases += 1
    print(f"ok {cases} simulated cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
