"""AsyncScheduler: scheduling one step ahead of the outputs. The first five tests are ported
from vLLM's tests/v1/core/test_async_scheduler.py with the same inputs and expectations."""

from __future__ import annotations

from collections import deque

import pytest

from cadence.scheduler.output import SchedulerOutput
from cadence.scheduler.request import FinishReason, Request, RequestStatus
from cadence.scheduler.scheduler import Scheduler
from tests.scheduler.factories import (
    EOS_TOKEN_ID,
    assert_scheduler_empty,
    create_requests,
    create_scheduler,
    output_for,
    runner_output,
)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_stop_by_max_tokens(max_tokens: int):
    scheduler = create_scheduler(async_scheduling=True)
    req0, req1 = create_requests(num_requests=2, max_tokens=max_tokens)

    expected_total_num_scheduled_tokens = 0
    sched_outputs: deque[SchedulerOutput] = deque()
    scheduler.add_request(req0)
    sched_outputs.append(scheduler.schedule())
    expected_total_num_scheduled_tokens += req0.num_prompt_tokens + max_tokens - 1

    scheduler.add_request(req1)
    sched_outputs.append(scheduler.schedule())
    expected_total_num_scheduled_tokens += req1.num_prompt_tokens + max_tokens - 1

    total_num_scheduled_tokens = 0
    while sched_outputs:
        sched_output = sched_outputs.popleft()
        total_num_scheduled_tokens += sched_output.total_num_scheduled_tokens
        scheduler.update_from_output(sched_output, output_for(sched_output))
        sched_output = scheduler.schedule()
        if sched_output.num_scheduled_tokens:
            sched_outputs.append(sched_output)

    assert scheduler.get_num_unfinished_requests() == 0
    assert req0.num_output_tokens == max_tokens
    assert req1.num_output_tokens == max_tokens
    # No step is scheduled past max_tokens.
    assert total_num_scheduled_tokens == expected_total_num_scheduled_tokens


def _abort_in_order(preempt: bool) -> None:
    # With preempt, the KV cache is so small that requests preempt each other along the way.
    num_blocks = 7 if preempt else 10000
    scheduler = create_scheduler(async_scheduling=True, num_blocks=num_blocks, block_size=4)
    requests = create_requests(num_requests=10, max_tokens=20, block_size=4)
    for req in requests:
        scheduler.add_request(req)

    sched_outputs: deque[SchedulerOutput] = deque()
    sched_outputs.append(scheduler.schedule())
    sched_outputs.append(scheduler.schedule())

    abort_order = [0, 8, 3, 1, 6, 4, 2, 5, 7, 9]
    abort_order_copy = abort_order.copy()

    def abort_request():
        if not abort_order:
            return
        req = requests[abort_order.pop(0)]
        scheduler.finish_requests(req.request_id, RequestStatus.FINISHED_ABORTED)

    while sched_outputs:
        abort_request()
        sched_output = sched_outputs.popleft()
        scheduler.update_from_output(sched_output, output_for(sched_output))
        sched_output = scheduler.schedule()
        if sched_output.num_scheduled_tokens:
            sched_outputs.append(sched_output)

    if not preempt:
        for i, req in enumerate(requests):
            assert req.status == RequestStatus.FINISHED_ABORTED
            assert req.num_output_tokens == abort_order_copy.index(i)
    else:
        assert scheduler.num_preemptions > 0
        assert all(req.status == RequestStatus.FINISHED_ABORTED for req in requests)
    assert_scheduler_empty(scheduler)


def test_abort():
    _abort_in_order(preempt=False)


def test_preempt():
    # vLLM's test_preempt repeats test_abort's inputs; run those, then the same abort sequence
    # on a KV cache small enough to force preemptions with tokens in flight.
    _abort_in_order(preempt=False)
    _abort_in_order(preempt=True)


CHUNK_SIZE = 1000
BLOCK_SIZE = 16
NUM_PROMPT_TOKENS = 100


def _prefix_caching_scheduler() -> Scheduler:
    return create_scheduler(
        async_scheduling=True,
        max_num_batched_tokens=CHUNK_SIZE,
        enable_prefix_caching=True,
        block_size=BLOCK_SIZE,
    )


def test_prefix_caching_for_prefill_dedup():
    scheduler = _prefix_caching_scheduler()
    requests = create_requests(
        num_requests=5,
        num_tokens=NUM_PROMPT_TOKENS,
        max_tokens=3,
        same_prompt=True,
        block_size=BLOCK_SIZE,
    )
    req0 = requests.pop(0)
    req1 = requests.pop(0)
    scheduler.add_request(req0)
    scheduler.add_request(req1)

    sched_outputs: deque[SchedulerOutput] = deque()
    sched_output = scheduler.schedule()
    sched_outputs.append(sched_output)
    # Prefix caching de-duplicates the prompts within one step: every block but the last is
    # shared between the two requests.
    assert len(sched_output.num_scheduled_tokens) == 2
    assert sched_output.num_scheduled_tokens[req0.request_id] == NUM_PROMPT_TOKENS
    assert sched_output.num_scheduled_tokens[req1.request_id] == NUM_PROMPT_TOKENS % BLOCK_SIZE

    sched_outputs.append(scheduler.schedule())
    while sched_outputs:
        added_req = None
        if requests:
            added_req = requests.pop(0)
            scheduler.add_request(added_req)
        sched_output = sched_outputs.popleft()
        scheduler.update_from_output(sched_output, output_for(sched_output))
        sched_output = scheduler.schedule()
        if sched_output.num_scheduled_tokens:
            sched_outputs.append(sched_output)
            if added_req:
                assert (
                    sched_output.num_scheduled_tokens[added_req.request_id]
                    == NUM_PROMPT_TOKENS % BLOCK_SIZE
                )
    assert scheduler.get_num_unfinished_requests() == 0


def test_prefix_caching_for_multi_turn():
    num_output_tokens = 200
    scheduler = _prefix_caching_scheduler()
    requests = create_requests(
        num_requests=5,
        num_tokens=NUM_PROMPT_TOKENS,
        max_tokens=num_output_tokens,
        block_size=BLOCK_SIZE,
    )
    for req in requests:
        scheduler.add_request(req)
    sched_outputs: deque[SchedulerOutput] = deque()
    sched_outputs.append(scheduler.schedule())
    sched_outputs.append(scheduler.schedule())
    while sched_outputs:
        sched_output = sched_outputs.popleft()
        scheduler.update_from_output(sched_output, output_for(sched_output))
        sched_output = scheduler.schedule()
        if sched_output.num_scheduled_tokens:
            sched_outputs.append(sched_output)
    assert scheduler.get_num_unfinished_requests() == 0

    # Next-turn requests whose prompts are the full output of the previous turn.
    next_turn = []
    for i, prev in enumerate(requests):
        (req,) = create_requests(
            num_requests=1,
            num_tokens=1,
            max_tokens=num_output_tokens,
            block_size=BLOCK_SIZE,
            req_ids=[f"turn2-{i}"],
        )
        req.__init__(
            req.request_id,
            list(prev.prompt_token_ids) + list(prev.output_token_ids),
            req.sampling_params,
            eos_token_id=req.eos_token_id,
            block_hasher=req._block_hasher,
        )
        next_turn.append(req)
    for req in next_turn:
        scheduler.add_request(req)
    sched_output = scheduler.schedule()
    # The next-turn requests hit the previous turn's cached prompt and output blocks.
    for req in next_turn:
        assert sched_output.num_scheduled_tokens[req.request_id] == (
            req.num_prompt_tokens % BLOCK_SIZE
        )


def test_placeholders_track_tokens_in_flight():
    scheduler = create_scheduler(async_scheduling=True, block_size=4)
    (req,) = create_requests(num_requests=1, num_tokens=6, max_tokens=10, block_size=4)
    scheduler.add_request(req)
    out0 = scheduler.schedule()
    assert req.num_output_placeholders == 1 and req.num_computed_tokens == 6
    # Scheduled again before out0's token is back: the input is the token in flight.
    out1 = scheduler.schedule()
    assert out1.num_scheduled_tokens == {"0": 1}
    assert out1.scheduled_cached_reqs.num_computed_tokens == [6]
    assert req.num_output_placeholders == 2 and req.num_tokens == 6
    # Block 1 (positions 4..7) is not cached: positions 6 and 7 are not known yet.
    kv = scheduler.kv_cache_manager
    assert kv.num_cached_block["0"] == 1
    scheduler.update_from_output(out0, runner_output(["0"], [[11]]))
    assert req.num_output_placeholders == 1 and req.output_token_ids == [11]
    assert kv.num_cached_block["0"] == 1  # still only 7 known tokens
    scheduler.update_from_output(out1, runner_output(["0"], [[12]]))
    assert req.num_output_placeholders == 0
    # Position 7's token is known, but its KV is computed only by the next step.
    assert kv.num_cached_block["0"] == 1
    out2 = scheduler.schedule()
    assert out2.scheduled_cached_reqs.num_computed_tokens == [7]
    assert kv.num_cached_block["0"] == 2


def test_eos_drops_the_token_of_the_step_already_launched():
    scheduler = create_scheduler(async_scheduling=True)
    (req,) = create_requests(num_requests=1, max_tokens=10)
    scheduler.add_request(req)
    out0 = scheduler.schedule()
    out1 = scheduler.schedule()  # launched before out0's EOS is known
    eco = scheduler.update_from_output(out0, runner_output(["0"], [[EOS_TOKEN_ID]]))
    assert eco.outputs[0].finish_reason == FinishReason.STOP
    assert eco.finished_requests == {"0"}
    eco = scheduler.update_from_output(out1, runner_output(["0"], [[7]]))
    assert eco.outputs == []
    assert req.output_token_ids == [EOS_TOKEN_ID]
    assert scheduler.schedule().finished_req_ids == {"0"}
    assert_scheduler_empty(scheduler)


def test_abort_between_schedule_and_update_drops_tokens():
    scheduler = create_scheduler(async_scheduling=True)
    req0, req1 = create_requests(num_requests=2)
    scheduler.add_request(req0)
    scheduler.add_request(req1)
    out0 = scheduler.schedule()
    scheduler.finish_requests("0", RequestStatus.FINISHED_ABORTED)
    eco = scheduler.update_from_output(out0, output_for(out0))
    assert [o.request_id for o in eco.outputs] == ["1"]
    assert req0.output_token_ids == []


def test_forced_reset_discards_the_token_in_flight():
    scheduler = create_scheduler(async_scheduling=True)
    (req,) = create_requests(num_requests=1, max_tokens=10)
    scheduler.add_request(req)
    out0 = scheduler.schedule()
    scheduler.update_from_output(out0, runner_output(["0"], [[5]]))
    in_flight = scheduler.schedule()  # samples output 1
    assert req.num_output_placeholders == 1

    assert scheduler.reset_prefix_cache(reset_running_requests=True)
    assert req.status == RequestStatus.PREEMPTED
    assert req.num_output_placeholders == 0 and req.num_stale_output_tokens == 1

    resumed = scheduler.schedule()
    assert resumed.preempted_req_ids == {"0"}
    (new,) = resumed.scheduled_new_reqs
    assert new.output_token_ids == [5] and resumed.num_scheduled_tokens == {"0": 11}

    # The stale token arrives first and is dropped; the recomputed one counts.
    eco = scheduler.update_from_output(in_flight, runner_output(["0"], [[6]]))
    assert eco.outputs == [] and req.output_token_ids == [5]
    eco = scheduler.update_from_output(resumed, runner_output(["0"], [[6]]))
    assert eco.outputs[0].new_token_ids == [6]
    assert req.output_token_ids == [5, 6] and req.num_output_placeholders == 0


def test_forced_reset_discards_every_token_in_flight():
    """Two steps in flight (the engine's depth-2 queue): both stale tokens are dropped
    (vLLM's reset_prefix_cache counts them per request)."""
    scheduler = create_scheduler(async_scheduling=True)
    (req,) = create_requests(num_requests=1, max_tokens=10)
    scheduler.add_request(req)
    out0 = scheduler.schedule()
    scheduler.update_from_output(out0, runner_output(["0"], [[5]]))
    in_flight = [scheduler.schedule(), scheduler.schedule()]
    assert req.num_output_placeholders == 2
    assert scheduler.reset_prefix_cache(reset_running_requests=True)
    resumed = scheduler.schedule()
    assert resumed.num_scheduled_tokens == {"0": 11}
    for stale, token in zip(in_flight, (6, 7), strict=True):
        eco = scheduler.update_from_output(stale, runner_output(["0"], [[token]]))
        assert eco.outputs == [] and req.output_token_ids == [5]
    eco = scheduler.update_from_output(resumed, runner_output(["0"], [[8]]))
    assert eco.outputs[0].new_token_ids == [8]
    assert req.output_token_ids == [5, 8] and req.num_output_placeholders == 0
    assert req.num_stale_output_tokens == 0


def _two_steps_on_a_full_pool() -> tuple[
    Scheduler, Request, Request, SchedulerOutput, SchedulerOutput
]:
    """Two 7-token requests take 2 blocks each of a 4-block pool (out0); position 7 still fits
    both (out1). Both steps are in flight: no output has come back."""
    scheduler = create_scheduler(
        async_scheduling=True, num_blocks=5, block_size=4, enable_prefix_caching=False
    )
    req0, req1 = create_requests(num_requests=2, num_tokens=7, max_tokens=5, block_size=4)
    scheduler.add_request(req0)
    scheduler.add_request(req1)
    out0 = scheduler.schedule()
    out1 = scheduler.schedule()
    return scheduler, req0, req1, out0, out1


def test_preempted_request_keeps_its_token_in_flight_and_resumes_after_it():
    scheduler, req0, req1, out0, out1 = _two_steps_on_a_full_pool()
    assert out1.num_scheduled_tokens == {"0": 1, "1": 1}
    scheduler.update_from_output(out0, output_for(out0))
    out2 = scheduler.schedule()  # req0 needs a third block: req1 is preempted
    assert out2.preempted_req_ids == {"1"} and out2.num_scheduled_tokens == {"0": 1}
    assert req1.status == RequestStatus.PREEMPTED and req1.num_output_placeholders == 1
    # The preempted request still gets the token of the step it was part of.
    scheduler.update_from_output(out1, output_for(out1))
    assert req1.output_token_ids == [1, 1] and req1.num_output_placeholders == 0
    # Drive the rest with two steps in flight, as the engine core does.
    in_flight = deque([out2])
    while in_flight or scheduler.has_requests():
        out = scheduler.schedule()
        if out.num_scheduled_tokens:
            in_flight.append(out)
        if in_flight:
            done = in_flight.popleft()
            scheduler.update_from_output(done, output_for(done, token_id=3))
    assert req0.num_output_tokens == 5 and req1.num_output_tokens == 5
    assert req1.output_token_ids == [1, 1, 3, 3, 3]
    assert req1.num_preemptions == 1
    assert_scheduler_empty(scheduler)


def test_preempted_request_waits_for_its_token_in_flight():
    """A preempted request is not resumed while a token it sampled is still in flight: the
    recomputation would sample that position a second time."""
    scheduler, req0, req1, out0, out1 = _two_steps_on_a_full_pool()
    scheduler.update_from_output(out0, output_for(out0))
    scheduler.schedule()  # preempts req1 while out1 (with req1's token) is in flight
    scheduler.finish_requests("0", RequestStatus.FINISHED_ABORTED)
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 4
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {}  # blocks are free, but req1's token is in flight
    scheduler.update_from_output(out1, output_for(out1))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"1": 9}
    assert out.scheduled_new_reqs[0].output_token_ids == [1, 1]


def test_reused_request_id_does_not_take_the_old_requests_token():
    """Abort "a" while its step is in flight, add a new "a": the old step's token is dropped."""
    scheduler = create_scheduler(async_scheduling=True)
    old = create_requests(1, num_tokens=20, req_ids=["a"])[0]
    scheduler.add_request(old)
    first = scheduler.schedule()
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    new = create_requests(1, num_tokens=20, req_ids=["a"], starting_idx=7)[0]
    scheduler.add_request(new)
    second = scheduler.schedule()
    outs = scheduler.update_from_output(first, output_for(first, token_id=284))
    assert all(o.request_id != "a" or not o.new_token_ids for o in outs.outputs)
    assert new.output_token_ids == []
    outs = scheduler.update_from_output(second, output_for(second, token_id=5))
    assert new.output_token_ids == [5]
