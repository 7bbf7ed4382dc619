"""One step's index arrays from the batch's per-request state, in one compiled pass.

``layout_step`` computes what ``InputBatch.prepare`` hands the runner: every token's position,
input id and KV slot, the query start locations, and each row's last-token index, whether its
last input is the token sampled on device, and whether it samples this step. As numpy it was
some 25 calls of a few microseconds each, more with the caches cold after a forward pass; the
host pays it before the step's first kernel (a prompt's time to first token waits on it).
The step's extents (sequence lengths, the longest query and sequence, the most blocks a row
holds) come out of the same pass: three numpy reductions cost ~45 us with cold caches.

Compiled with numba on first use (cached on disk where numba finds a writable place, else
compiled once per process); ``layout_step_numpy`` is the same arithmetic in numpy, the
reference the tests hold the compiled pass to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

__all__ = ["ROW_ARRAYS", "layout_step", "layout_step_numpy", "stage_step"]

# The int32 arrays of a step's row block, in the order of ``stage_step``'s ``offsets``.
ROW_ARRAYS = ("query_start_loc", "seq_lens", "req_slots", "last_token_index", "use_sampled",
              "sample_slots", "logits_index", "counts")


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled by numba, its machine code cached on disk when numba has a writable
    cache location (next to this module, the user's cache directory or NUMBA_CACHE_DIR)."""
    try:
        return njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # numba found no writable cache location: compile per process
        return njit(nogil=True)(fn)


@compiled
def layout_step(slots, start, n, token_ids, block_table, num_known, num_tokens, num_blocks,
                block_size):  # pragma: no cover - compiled; layout_step_numpy is its twin
    """(positions, input_ids, slot_mapping, query_start_loc, last_token_index, use_sampled,
    sample_rows, seq_lens, max_query_len, max_seq_len, max_blocks); also counts one more token
    in ``num_tokens`` for every sampling row. ``max_blocks``: the most blocks a row's slot
    holds (``num_blocks``), 0 for an empty step."""
    b = slots.shape[0]
    max_len = token_ids.shape[1]
    qsl = np.zeros(b + 1, np.int32)
    seq_lens = np.empty(b, np.int32)
    max_q = 0
    max_seq = 0
    max_blocks = 0
    for r in range(b):
        qsl[r + 1] = qsl[r] + n[r]
        seq_lens[r] = start[r] + n[r]
        max_q = max(max_q, n[r])
        max_seq = max(max_seq, start[r] + n[r])
        max_blocks = max(max_blocks, num_blocks[slots[r]])
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
    return (positions, input_ids, slot_mapping, qsl, last, use_sampled,
            sample[:num_sample].copy(), seq_lens, max_q, max_seq, max_blocks)


@compiled
def stage_step(ids_dst, pos_dst, slot_dst, rows_dst, offsets, bt_dst, input_ids, positions,
               slot_mapping, qsl, seq_lens, slots, last, use_sampled, sample_rows, block_tables,
               tokens, rows):  # pragma: no cover - compiled; the step-buffer tests check it
    """Write one step's arrays into a pinned staging set, padded to ``tokens`` tokens and
    ``rows`` rows: padding tokens take id 0, position 0 and slot -1; padding rows an empty
    query range at the step's end and zeros. ``rows_dst`` is the int32 row block, each of
    ``ROW_ARRAYS`` at its offset; ``bt_dst`` the block table, of which the step's columns are
    written. One compiled call instead of a dozen numpy slice assignments (~50 us with the
    caches cold)."""
    t = qsl[qsl.shape[0] - 1]
    b = slots.shape[0]
    ns = sample_rows.shape[0]
    for i in range(t):
        ids_dst[i] = input_ids[i]
        pos_dst[i] = positions[i]
        slot_dst[i] = slot_mapping[i]
    for i in range(t, tokens):
        ids_dst[i] = 0
        pos_dst[i] = 0
        slot_dst[i] = -1
    o_qsl, o_len, o_slot, o_last, o_use, o_sslot, o_logit, o_counts = (
        offsets[0], offsets[1], offsets[2], offsets[3], offsets[4], offsets[5], offsets[6],
        offsets[7])
    for r in range(b + 1):
        rows_dst[o_qsl + r] = qsl[r]
    for r in range(b + 1, rows + 1):
        rows_dst[o_qsl + r] = t
    for r in range(rows):
        inside = r < b
        rows_dst[o_len + r] = seq_lens[r] if inside else 0
        rows_dst[o_slot + r] = slots[r] if inside else 0
        rows_dst[o_last + r] = last[r] if inside else 0
        rows_dst[o_use + r] = use_sampled[r] if inside else 0
    for j in range(ns):
        rows_dst[o_sslot + j] = slots[sample_rows[j]]
        rows_dst[o_logit + j] = last[sample_rows[j]]
    rows_dst[o_counts] = b
    rows_dst[o_counts + 1] = ns
    nb = block_tables.shape[1]
    for r in range(b):
        for c in range(nb):
            bt_dst[r, c] = block_tables[r, c]


def layout_step_numpy(slots, start, n, token_ids, block_table, num_known, num_tokens,
                      num_blocks, block_size):
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
    return (positions, input_ids, slot_mapping, qsl, last, use_sampled, sample_rows,
            end.astype(np.int32), int(n.max()) if b else 0, int(end.max()) if b else 0,
            int(num_blocks[slots].max()) if b else 0)
