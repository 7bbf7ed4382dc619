from __future__ import annotations

import numpy as np
import pytest

from cadence.sampling_params import SamplingParams
from cadence.scheduler.output import CachedRequestData, NewRequestData, SchedulerOutput
from cadence.worker.input_batch import InputBatch


def _batch_with(n: int) -> InputBatch:
    batch = InputBatch(8, 64, 4, 16)
    for i in range(n):
        batch.add(f"r{i}", [i + 1] * (i + 2), [], SamplingParams(), [10 * i + 1])
    return batch


def test_rows_stay_condensed_and_moves_are_reported():
    batch = _batch_with(4)
    assert [batch.req_id_to_slot[f"r{i}"] for i in range(4)] == [0, 1, 2, 3]
    batch.remove("r1")  # r3 moves into row 1
    assert batch.req_id_to_slot == {"r0": 0, "r3": 1, "r2": 2}
    assert batch.take_moves() == ([3], [1])
    assert batch.num_known[1] == 5 and list(batch.token_ids[1, :5]) == [4] * 5
    assert batch.block_table[1, 0] == 31 and batch.num_blocks[1] == 1
    assert batch.slot_req_ids[:4] == ["r0", "r3", "r2", None]
    assert batch.take_moves() == ([], [])


def test_a_rows_sampling_fields_are_its_requests_and_move_with_it():
    batch = _batch_with(2)
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.25)
    slot = batch.add("s", [1, 2, 3], [], params, [7])
    got = (batch.temperature[slot], batch.top_p[slot], batch.top_k[slot], batch.min_p[slot])
    assert got == pytest.approx((0.7, 0.9, 5, 0.25))
    batch.remove("r0")  # the last row ("s") moves into row 0
    batch.take_moves()
    assert batch.req_id_to_slot["s"] == 0 and batch.min_p[0] == pytest.approx(0.25)
    assert batch.top_k[0] == 5


def test_chained_moves_compose_into_one_gather():
    batch = _batch_with(4)
    batch.remove("r0")  # r3: 3 -> 0
    batch.remove("r3")  # now at row 0; r2 (last) moves 2 -> 0
    assert batch.req_id_to_slot == {"r2": 0, "r1": 1}
    # Row 0 ends up holding what row 2 held at the start of the step.
    assert batch.take_moves() == ([2], [0])
    batch.add("new", [7, 7], [], SamplingParams(), [99])
    assert batch.req_id_to_slot["new"] == 2
    assert batch.take_moves() == ([], [])


def test_removing_the_last_row_moves_nothing():
    batch = _batch_with(3)
    batch.remove("r2")
    assert batch.take_moves() == ([], [])
    assert len(batch) == 2


def test_prepare_after_condensing_reads_moved_rows():
    batch = _batch_with(3)
    batch.remove("r0")  # r2 moves to row 0
    batch.take_moves()
    cached = CachedRequestData(["r2", "r1"], [None, None], [0, 0])
    so = SchedulerOutput([], cached, {"r2": 4, "r1": 3}, 7)
    inp = batch.prepare(so)
    np.testing.assert_array_equal(inp.slots, [0, 1])
    np.testing.assert_array_equal(inp.input_ids, [3, 3, 3, 3, 2, 2, 2])
    # Every prompt is now fully scheduled: both rows sample.
    np.testing.assert_array_equal(inp.sample_rows, [0, 1])


def test_resumed_request_is_readded_with_its_outputs():
    batch = _batch_with(2)
    so = SchedulerOutput(
        [NewRequestData("r0", [1, 1], [5, 6], SamplingParams(), [3], 0)],
        CachedRequestData(), {"r0": 4}, 4, preempted_req_ids={"r0"})
    batch.apply(so)
    slot = batch.req_id_to_slot["r0"]
    assert batch.num_known[slot] == 4 and list(batch.token_ids[slot, :4]) == [1, 1, 5, 6]
    assert len(batch) == 2


def _inputs(seq_lens: list[int], query_lens: list[int]):
    from cadence.worker.input_batch import StepInputs

    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    t, b = int(qsl[-1]), len(seq_lens)
    zeros = np.zeros(t, dtype=np.int64)
    return StepInputs(
        req_ids=[f"r{i}" for i in range(b)], slots=np.arange(b, dtype=np.int32),
        input_ids=zeros, positions=zeros, slot_mapping=zeros, query_start_loc=qsl,
        seq_lens=np.array(seq_lens, dtype=np.int32), block_tables=np.zeros((b, 4), np.int32),
        last_token_index=qsl[1:] - 1, use_sampled=np.zeros(b, np.int32),
        sample_rows=np.arange(b, dtype=np.int32), max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("seq_lens", "query_lens", "fresh"),
    [
        ([10], [10], True),  # one prompt, all of it this step
        ([26], [10], False),  # a later chunk: 16 tokens of context
        ([1], [1], True),  # a one-token prompt
        ([10, 10], [10, 10], False),  # two prompts
        # A decode at length 11 beside a 10-token prompt: the first row's length equals the
        # step's tokens, yet two sequences share the pass.
        ([11, 10], [1, 10], False),
    ],
)
def test_fresh_prompt_is_one_request_without_context(seq_lens, query_lens, fresh):
    assert _inputs(seq_lens, query_lens).fresh_prompt is fresh
