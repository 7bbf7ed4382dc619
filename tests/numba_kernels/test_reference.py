from __future__ import annotations

import numpy as np
import pytest

from cadence.numba_kernels.reference import combine_reference, scatter_reference
from tests.numba_kernels.batches import combine_loop, random_batch, scatter_loop


@pytest.mark.parametrize("seed", range(20))
def test_references_match_row_loops(seed: int) -> None:
    b = random_batch(np.random.default_rng(seed))
    ids = b.input_ids.copy()
    combine_reference(
        ids, b.last_sampled, b.req_indices, b.last_token_index, b.use_sampled, b.count
    )
    np.testing.assert_array_equal(ids, combine_loop(b))
    last = b.last_sampled.copy()
    scatter_reference(b.sampled, b.req_indices, last, b.count)
    np.testing.assert_array_equal(last, scatter_loop(b))


def test_prefill_rows_keep_prompt_tokens_and_decode_rows_take_last_sampled() -> None:
    ids = np.array([10, 11, 12, 13, 14], np.int64)
    last = np.array([100, 101, 102], np.int64)
    req = np.array([2, 0, 1], np.int32)
    lti = np.array([2, 3, 4], np.int32)  # row 0 is a 3-token prefill chunk ending at token 2
    use = np.array([0, 1, 1], np.int8)
    combine_reference(ids, last, req, lti, use, np.array([3], np.int32))
    assert ids.tolist() == [10, 11, 12, 100, 101]


def test_rows_past_count_and_out_of_range_indices_are_ignored() -> None:
    ids = np.zeros(4, np.int64)
    last = np.array([7, 8], np.int64)
    combine_reference(
        ids,
        last,
        np.array([0, 5, 1], np.int32),  # row 1 points past last_sampled
        np.array([0, 1, 2], np.int32),
        np.ones(3, np.int32),
        np.array([2], np.int32),  # row 2 is padding
    )
    assert ids.tolist() == [7, 0, 0, 0]
    scatter_reference(
        np.array([5, 6, 9], np.int64), np.array([1, -1, 0], np.int32), last, np.array([2], np.int32)
    )
    assert last.tolist() == [7, 5]
