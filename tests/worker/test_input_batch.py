from __future__ import annotations

import numpy as np

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
