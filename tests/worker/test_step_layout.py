from __future__ import annotations

import numpy as np
import pytest

from cadence.worker import step_layout
from cadence.worker.step_layout import layout_step, layout_step_numpy


def _state(seed: int, rows: int = 8, max_len: int = 300, width: int = 20):
    rng = np.random.default_rng(seed)
    token_ids = rng.integers(0, 50_000, (rows, max_len), dtype=np.int64)
    block_table = rng.integers(0, 1000, (rows, width), dtype=np.int32)
    num_known = rng.integers(0, max_len, rows, dtype=np.int64)
    num_tokens = num_known + rng.integers(0, 2, rows, dtype=np.int64)
    return rng, token_ids, block_table, num_known, num_tokens


@pytest.mark.parametrize("seed", range(6))
def test_compiled_layout_equals_numpy(seed: int) -> None:
    """Random steps (prefill chunks, decodes, rows that do and do not sample, positions the
    host does not know yet) give the same arrays, and count the same sampled tokens."""
    rng, token_ids, block_table, num_known, num_tokens = _state(seed)
    b = int(rng.integers(0, 9))
    slots = rng.permutation(8)[:b].astype(np.int32)
    n = rng.integers(1, 40, b).astype(np.int64)
    start = np.minimum(num_known[slots], 300 - n).astype(np.int64)
    start[rng.random(b) < 0.3] += 1  # a last input the host does not know (sampled on device)
    num_blocks = rng.integers(0, 20, 8).astype(np.int32)
    counts_a, counts_b = num_tokens.copy(), num_tokens.copy()
    got = layout_step(slots, start, n, token_ids, block_table, num_known, counts_a, num_blocks,
                      16)
    want = layout_step_numpy(slots, start, n, token_ids, block_table, num_known, counts_b,
                             num_blocks, 16)
    assert len(got) == len(want) == 11
    for g, w, dtype in zip(got[:8], want[:8], (np.int64, np.int64, np.int64, np.int32,
                                               np.int32, np.int32, np.int32, np.int32),
                           strict=True):
        assert g.dtype == dtype and w.dtype == dtype
        np.testing.assert_array_equal(g, w)
    assert tuple(got[8:]) == tuple(want[8:])
    # The extents by their definition, from the inputs.
    assert got[7].tolist() == (start + n).tolist()
    assert got[8:] == ((max(n.tolist(), default=0), max((start + n).tolist(), default=0),
                        max(num_blocks[slots].tolist(), default=0)))
    np.testing.assert_array_equal(counts_a, counts_b)


def test_layout_by_hand() -> None:
    """Two rows: a 3-token chunk of slot 1 from position 30 and a decode of slot 0 at 17."""
    token_ids = np.arange(2 * 40, dtype=np.int64).reshape(2, 40)
    block_table = np.array([[5, 6, 7], [8, 9, 4]], dtype=np.int32)
    num_known = np.array([17, 40], dtype=np.int64)  # slot 0's position 17 is sampled on device
    num_tokens = np.array([18, 40], dtype=np.int64)
    slots = np.array([1, 0], dtype=np.int32)
    num_blocks = np.array([2, 3], dtype=np.int32)
    (positions, ids, slot_map, qsl, last, use_sampled, sample_rows, seq_lens, max_q, max_seq,
     max_blocks) = layout_step(slots, np.array([30, 17]), np.array([3, 1]), token_ids,
                               block_table, num_known, num_tokens, num_blocks, 16)
    assert seq_lens.tolist() == [33, 18] and (max_q, max_seq, max_blocks) == (3, 33, 3)
    assert positions.tolist() == [30, 31, 32, 17]
    assert ids.tolist() == [70, 71, 72, 17]
    # Slot 1: positions 30, 31 in its block 1 (id 9), 32 in block 2 (id 4); slot 0: block 1 (6).
    assert slot_map.tolist() == [9 * 16 + 14, 9 * 16 + 15, 4 * 16 + 0, 6 * 16 + 1]
    assert qsl.tolist() == [0, 3, 4] and last.tolist() == [2, 3]
    assert use_sampled.tolist() == [0, 1]
    # Row 0 ends at 33 < 40 tokens (a chunk): no sample; row 1 reaches 18: samples.
    assert sample_rows.tolist() == [1] and num_tokens.tolist() == [19, 40]


def test_compiles_without_a_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where numba finds no writable cache location (it raises when asked to cache), the pass
    is compiled per process instead of failing the import."""
    calls = []

    def njit(**options):
        calls.append(options)
        if options.get("cache"):
            raise RuntimeError("cannot cache function: no locator available")
        return lambda fn: fn

    monkeypatch.setattr(step_layout, "njit", njit)
    fn = step_layout.compiled(layout_step_numpy)
    assert fn is layout_step_numpy
    assert calls == [{"cache": True, "nogil": True}, {"nogil": True}]
