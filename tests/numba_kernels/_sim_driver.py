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
import torch  # noqa: E402

from cadence.numba_kernels.launcher import NumbaTokenKernels, TokenBuffers  # noqa: E402
from tests.numba_kernels.batches import combine_loop, random_batch, scatter_loop  # noqa: E402


def check_launcher(seed: int, use_dtype: type) -> None:
    rng = np.random.default_rng(seed)
    b = random_batch(rng, rows=40, max_reqs=50, use_dtype=use_dtype)
    want_ids, want_last = combine_loop(b), scatter_loop(b)
    t = {k: torch.from_numpy(v.copy()) for k, v in vars(b).items()}
    bufs = TokenBuffers(
        input_ids=t["input_ids"],
        last_sampled=t["last_sampled"],
        req_indices=t["req_indices"],
        last_token_index=t["last_token_index"],
        use_sampled=t["use_sampled"],
        num_reqs=t["count"],
        sampled=t["sampled"],
    )
    kernels = NumbaTokenKernels(bufs, threads_per_block=16)  # several blocks
    assert kernels.simulator and kernels.blocks == 3
    kernels.combine()
    np.testing.assert_array_equal(bufs.input_ids.numpy(), want_ids, err_msg=f"combine {seed}")
    kernels.scatter()
    np.testing.assert_array_equal(bufs.last_sampled.numpy(), want_last, err_msg=f"scatter {seed}")
    # The same views serve a later step: new contents and count, no rebuild.
    b2 = random_batch(rng, rows=40, max_reqs=50, use_dtype=use_dtype)
    for name, value in vars(b2).items():
        getattr(bufs, "num_reqs" if name == "count" else name).copy_(torch.from_numpy(value))
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
