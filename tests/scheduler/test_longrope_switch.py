"""longrope past its original length L (``rope_switch_len``): a request of more than L tokens
takes the long factors for every key, a shorter one the short factors; one that grows past L
while decoding is recomputed there (transformers' Phi-3 recomputes its cache at that step), and
blocks of the two rotations are never shared through the prefix cache."""

from __future__ import annotations

from cadence.scheduler.block_hash import hash_block_tokens, salted_root
from cadence.scheduler.request import RequestStatus
from tests.scheduler.factories import create_requests, create_scheduler, output_for, runner_output

SWITCH = 8  # L
BLOCK = 4


def _decode_until_the_switch(scheduler, request) -> None:
    """Prefill 6 tokens, then decode positions 6 and 7 (sequences of 7 and 8 tokens: <= L)."""
    for _ in range(3):
        out = scheduler.schedule()
        assert out.num_scheduled_tokens[request.request_id] in (6, 1)
        assert not out.preempted_req_ids and not request.rope_long
        scheduler.update_from_output(out, runner_output([request.request_id], [[77]]))
    assert (request.num_computed_tokens, request.num_tokens) == (SWITCH, SWITCH + 1)


def test_a_request_growing_past_the_switch_is_recomputed_on_the_long_factors():
    scheduler = create_scheduler(block_size=BLOCK, max_model_len=64, rope_switch_len=SWITCH)
    (request,) = create_requests(1, num_tokens=6, max_tokens=10, block_size=BLOCK)
    scheduler.add_request(request)
    _decode_until_the_switch(scheduler, request)
    short_first_block = request.block_hashes[0]
    # Position 8 would make a sequence of 9 tokens: released for recomputation (the runner
    # drops it as preempted), not counted as a preemption: no memory was short.
    out = scheduler.schedule()
    assert out.preempted_req_ids == {request.request_id}
    assert out.num_scheduled_tokens == {}
    assert request.status == RequestStatus.PREEMPTED and request.num_preemptions == 0
    # Readmitted as new: every one of its 9 tokens again, none from the short blocks it left
    # in the prefix cache, on the long factors.
    out = scheduler.schedule()
    (new,) = out.scheduled_new_reqs
    assert new.req_id == request.request_id and new.num_computed_tokens == 0
    assert out.num_scheduled_tokens == {request.request_id: SWITCH + 1}
    assert request.rope_long and request.num_cached_tokens == 0
    assert request.block_hashes[0] != short_first_block
    scheduler.update_from_output(out, output_for(out, 78))
    out = scheduler.schedule()  # decoding on: no second recomputation
    assert out.num_scheduled_tokens == {request.request_id: 1} and not out.preempted_req_ids
    assert scheduler.num_preemptions == 0


def test_switches_on_consecutive_steps_hold_back_neither_the_queue_nor_each_other():
    """Requests crossing the switch one step after another: each is readmitted on the next
    step, first in line, and a waiting request is admitted in the very step of a switch."""
    scheduler = create_scheduler(block_size=BLOCK, max_model_len=64, rope_switch_len=SWITCH)
    (a,) = create_requests(1, num_tokens=SWITCH, max_tokens=20, block_size=BLOCK, req_ids=["a"])
    # 7 tokens: crosses one step after a.
    (b,) = create_requests(1, num_tokens=SWITCH - 1, max_tokens=20, block_size=BLOCK,
                           req_ids=["b"], starting_idx=1)
    for request in (a, b):
        scheduler.add_request(request)
    out = scheduler.schedule()  # both prompts
    scheduler.update_from_output(out, output_for(out, 77))
    (late,) = create_requests(1, num_tokens=3, max_tokens=20, block_size=BLOCK, req_ids=["late"])
    scheduler.add_request(late)
    out = scheduler.schedule()  # a crosses (9 tokens); b decodes; late is admitted all the same
    assert out.preempted_req_ids == {a.request_id}
    assert out.num_scheduled_tokens == {b.request_id: 1, "late": 3}
    scheduler.update_from_output(out, output_for(out, 77))
    out = scheduler.schedule()  # a readmitted first; b crosses (9 tokens)
    assert out.preempted_req_ids == {b.request_id}
    assert out.num_scheduled_tokens == {a.request_id: SWITCH + 1, "late": 1}
    scheduler.update_from_output(out, output_for(out, 77))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {a.request_id: 1, "late": 1, b.request_id: SWITCH + 1}
    assert a.rope_long and b.rope_long and scheduler.num_preemptions == 0


def test_a_prompt_past_the_switch_takes_the_long_factors_and_shares_no_short_block():
    scheduler = create_scheduler(block_size=BLOCK, max_model_len=64, rope_switch_len=SWITCH,
                                 max_num_batched_tokens=4)
    (long,) = create_requests(1, num_tokens=10, max_tokens=2, block_size=BLOCK)
    scheduler.add_request(long)
    assert long.rope_long
    root = salted_root(None)
    assert long.block_hashes[0] != hash_block_tokens(root, long.all_token_ids[:BLOCK])
    for chunk in (4, 4, 2):  # chunked by the budget, never recomputed
        out = scheduler.schedule()
        assert out.num_scheduled_tokens == {long.request_id: chunk}
        assert not out.preempted_req_ids
        sampled = [[5]] if chunk == 2 else [[]]  # a chunk short of the prompt's end samples none
        scheduler.update_from_output(out, runner_output([long.request_id], sampled))
    # A short prompt with the same first 8 tokens finds none of the long prompt's blocks.
    (short,) = create_requests(1, num_tokens=8, max_tokens=1, block_size=BLOCK,
                               req_ids=["short"])
    assert short.all_token_ids == long.all_token_ids[:8]
    scheduler.add_request(short)
    assert not short.rope_long
    out = scheduler.schedule()
    assert short.num_cached_tokens == 0
    assert short.block_hashes[0] == hash_block_tokens(root, long.all_token_ids[:BLOCK])


def test_async_the_switch_waits_for_the_token_in_flight():
    """Async scheduling: the step past L is found with the input token still in flight; the
    request is readmitted once it has arrived, with all of its 9 tokens."""
    scheduler = create_scheduler(block_size=BLOCK, max_model_len=64, rope_switch_len=SWITCH,
                                 async_scheduling=True)
    (request,) = create_requests(1, num_tokens=6, max_tokens=10, block_size=BLOCK)
    scheduler.add_request(request)
    pending = []
    for _ in range(3):  # prefill and two decode steps, each scheduled before the last's output
        out = scheduler.schedule()
        assert not out.preempted_req_ids
        pending.append(out)
        if len(pending) == 2:
            done = pending.pop(0)
            scheduler.update_from_output(done, output_for(done, 77))
    out = scheduler.schedule()  # position 8: its input (sampled at 7) is still in flight
    assert out.preempted_req_ids == {request.request_id} and out.num_scheduled_tokens == {}
    assert request.num_output_placeholders == 1
    assert scheduler.schedule().num_scheduled_tokens == {}  # held back until it arrives
    done = pending.pop(0)
    scheduler.update_from_output(done, output_for(done, 77))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {request.request_id: SWITCH + 1} and request.rope_long


def test_requests_crossing_the_switch_in_one_step_are_readmitted_in_their_order():
    scheduler = create_scheduler(block_size=BLOCK, max_model_len=64, rope_switch_len=SWITCH)
    a, b = create_requests(2, num_tokens=SWITCH, max_tokens=20, block_size=BLOCK,
                           req_ids=["a", "b"])
    for request in (a, b):
        scheduler.add_request(request)
    out = scheduler.schedule()  # both prefill their 8 tokens (<= L)
    assert out.num_scheduled_tokens == {"a": SWITCH, "b": SWITCH}
    scheduler.update_from_output(out, output_for(out, 77))
    out = scheduler.schedule()  # position 8 for both: both released for recomputation
    assert out.preempted_req_ids == {"a", "b"}
    assert [r.request_id for r in scheduler.waiting] == ["a", "b"]
