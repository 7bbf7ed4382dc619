"""The Numba CUDA kernels. Importing this module imports ``numba.cuda``: set
``NUMBA_ENABLE_CUDASIM=1`` before the first import to run them in Numba's simulator.

The row count comes from a 1-element device int32 array and the launch always covers the full
(padded) row capacity, so one launch configuration serves every step and graph capture works:
rows at or past ``count[0]`` do nothing whatever their buffer contents.
"""

from __future__ import annotations

from numba import cuda

THREADS_PER_BLOCK = 128


@cuda.jit
def combine_kernel(input_ids, last_sampled, req_indices, last_token_index, use_sampled, count):
    b = cuda.grid(1)
    if b < count[0] and b < req_indices.shape[0] and use_sampled[b] != 0:
        t = last_token_index[b]
        r = req_indices[b]
        if 0 <= t < input_ids.shape[0] and 0 <= r < last_sampled.shape[0]:
            input_ids[t] = last_sampled[r]


@cuda.jit
def scatter_kernel(sampled, req_indices, last_sampled, count):
    i = cuda.grid(1)
    if i < count[0] and i < req_indices.shape[0]:
        r = req_indices[i]
        if 0 <= r < last_sampled.shape[0]:
            last_sampled[r] = sampled[i]
