"""One step's index arrays from the batch's per-request state, in one compiled pass.

``layout_step`` computes what ``InputBatch.prepare`` hands the runner: every token's position,
input id and KV slot, the query start locations, and each row's last-token index, whether its
last input is the token sampled on device, and whether it samples this step. As numpy it was
some 25 calls of a few microseconds each, more with the caches cold after a forward pass; the
host pays it before the step's first kernel (a prompt's time to first token waits on it).

Compiled with numba on first use (cached on disk where numba finds a writable place, else
compiled once per process); ``layout_step_numpy`` is the same arithmetic in numpy, the
reference the tests hold the compiled pass to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

__all__ = ["layout_step", "layout_step_numpy"]


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled by numba, its machine code cached on disk when numba has a writable
    cache location (next to this module, the user's cache directory or NUMBA_CACHE_DIR)."""
    try:
        return njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # numba found no writable cache location: compile per process
        return njit(nogil=True)(fn)


@compiled
def layout_step(slots, start, n, token_ids, block_table, num_known, num_tokens,
                block_size):  # pragma: no cover - compiled; layout_step_numpy is its twin
    """(positions, input_ids, slot_mapping, query_start_loc, last_token_index, use_sampled,
    sample_rows); also counts one more token in ``num_tokens`` for every sampling row."""
    b = slots.shape[0]
    max_len = token_ids.shape[1]
    qsl = np.zeros(b + 1, np.int32)
    for r in range(b):
        qsl[r + 1] = qsl[r] + n[r]
    t = qsl[b]
    positions = np.empty(t, np.int64)
    input_ids = np.empty(t, np.int64)
    slot_mapping = np.empty(t, np.int64)
    last = np.empty(b, np.int32)
    use_sampled = np.empty(b, np.int32)
    sample = np.empty(b, np.int32)
    num_sample = 0
    for r in range(b):
        s = slots[r]
        for i in range(n[r]):
            k = qsl[r] + i
            p = start[r] + i
            positions[k] = p
            # Positions the host does not know read a stale id; combine overwrites them.
            input_ids[k] = token_ids[s, min(p, max_len - 1)]
            slot_mapping[k] = block_table[s, p // block_size] * block_size + p % block_size
        end = start[r] + n[r]
        last[r] = qsl[r + 1] - 1
        use_sampled[r] = 1 if end - 1 >= num_known[s] else 0
        if end >= num_tokens[s]:
            sample[num_sample] = r
            num_sample += 1
    for j in range(num_sample):
        num_tokens[slots[sample[j]]] += 1
    return positions, input_ids, slot_mapping, qsl, last, use_sampled, sample[:num_sample].copy()


def layout_step_numpy(slots, start, n, token_ids, block_table, num_known, num_tokens,
                      block_size):
    """``layout_step`` in numpy (the reference)."""
    b = len(slots)
    qsl = np.zeros(b + 1, dtype=np.int32)
    np.cumsum(n, out=qsl[1:])
    t = int(qsl[-1])
    row_of_token = np.repeat(np.arange(b), n)
    positions = np.arange(t, dtype=np.int64) - np.repeat(qsl[:-1], n) + start[row_of_token]
    tok_slots = slots[row_of_token]
    input_ids = token_ids[tok_slots, np.minimum(positions, token_ids.shape[1] - 1)]
    blk = block_table[tok_slots, positions // block_size].astype(np.int64)
    slot_mapping = blk * block_size + positions % block_size
    end = start + n
    last = (qsl[1:] - 1).astype(np.int32)
    use_sampled = (end - 1 >= num_known[slots]).astype(np.int32)
    sample_rows = np.nonzero(end >= num_tokens[slots])[0].astype(np.int32)
    num_tokens[slots[sample_rows]] += 1
    return positions, input_ids, slot_mapping, qsl, last, use_sampled, sample_rows
