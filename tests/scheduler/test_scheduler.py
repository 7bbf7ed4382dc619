"""Scheduler basics, ported from vLLM's tests/v1/core/test_scheduler.py (same inputs, same
expected outcomes), plus the output protocol the model runner relies on."""

from __future__ import annotations

import pytest

from cadence.config import CacheConfig, SchedulerConfig
from cadence.runner_output import LogprobsLists, ModelRunnerOutput
from cadence.scheduler.request import FinishReason, RequestStatus
from cadence.scheduler.scheduler import Scheduler
from tests.scheduler.factories import (
    EOS_TOKEN_ID,
    assert_scheduler_empty,
    create_requests,
    create_scheduler,
    output_for,
    runner_output,
)


def test_add_requests():
    scheduler = create_scheduler()
    for i, request in enumerate(create_requests(num_requests=10)):
        scheduler.add_request(request)
        assert request.request_id in scheduler.requests
        assert len(scheduler.waiting) == i + 1


def test_add_request_rejects_duplicates_and_overlong_prompts():
    scheduler = create_scheduler(max_num_batched_tokens=64)
    request = create_requests(num_requests=1)[0]
    scheduler.add_request(request)
    with pytest.raises(ValueError, match="already scheduled"):
        scheduler.add_request(create_requests(num_requests=1)[0])
    with pytest.raises(ValueError, match="maximum context length is 64"):
        scheduler.add_request(create_requests(num_requests=1, num_tokens=64, req_ids=["x"])[0])


def test_finish_request():
    scheduler = create_scheduler()
    requests = create_requests(num_requests=10)
    for request in requests:
        scheduler.add_request(request)
    for i, request in enumerate(requests):
        scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)
        assert request.request_id not in scheduler.requests
        assert len(scheduler.waiting) == 9 - i


def test_finish_requests_is_idempotent():
    scheduler = create_scheduler()
    requests = create_requests(num_requests=3)
    for request in requests:
        scheduler.add_request(request)
    output = scheduler.schedule()
    scheduler.finish_requests(["0", "0", "unknown"], RequestStatus.FINISHED_ABORTED)
    scheduler.finish_requests("0", RequestStatus.FINISHED_ABORTED)
    assert requests[0].status == RequestStatus.FINISHED_ABORTED
    assert [r.request_id for r in scheduler.running] == ["1", "2"]
    # An aborted request's sampled token is dropped; the others' are kept.
    eco = scheduler.update_from_output(output, output_for(output))
    assert [o.request_id for o in eco.outputs] == ["1", "2"]
    assert eco.finished_requests == {"0"}
    assert scheduler.schedule().finished_req_ids == {"0"}
    with pytest.raises(ValueError):
        scheduler.finish_requests("1", RequestStatus.RUNNING)


def test_finish_requests_none_finishes_every_request():
    """vLLM's ``finish_requests(None, ...)``: all requests, running and waiting."""
    scheduler = create_scheduler(max_num_seqs=2)
    requests = create_requests(num_requests=4)
    for request in requests:
        scheduler.add_request(request)
    scheduler.schedule()
    assert scheduler.get_request_counts() == (2, 2)
    scheduler.finish_requests(None, RequestStatus.FINISHED_ABORTED)
    assert all(r.status == RequestStatus.FINISHED_ABORTED for r in requests)
    assert scheduler.get_request_counts() == (0, 0) and not scheduler.has_unfinished_requests()
    assert scheduler.kv_cache_manager.block_pool.get_usage() == 0.0
    assert scheduler.schedule().finished_req_ids == {"0", "1", "2", "3"}


def test_get_num_unfinished_requests():
    scheduler = create_scheduler()
    requests = create_requests(num_requests=10)
    for request in requests:
        scheduler.add_request(request)
    for i, request in enumerate(requests):
        scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_STOPPED)
        assert scheduler.get_num_unfinished_requests() == len(requests) - i - 1
    assert not scheduler.has_unfinished_requests()
    assert scheduler.has_finished_requests() and scheduler.has_requests()


# vLLM's parametrization: [False-None] and [True-5] (prefix caching, prompt logprobs).
CACHING_AND_PROMPT_LOGPROBS = [(False, None), (True, None), (True, 5)]


@pytest.mark.parametrize(("enable_prefix_caching", "prompt_logprobs"),
                         CACHING_AND_PROMPT_LOGPROBS)
def test_schedule(enable_prefix_caching: bool, prompt_logprobs: int | None):
    scheduler = create_scheduler(enable_prefix_caching=enable_prefix_caching)
    requests = create_requests(num_requests=10, prompt_logprobs=prompt_logprobs)
    for request in requests:
        scheduler.add_request(request)

    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == len(requests)
    assert output.scheduled_cached_reqs.num_reqs == 0
    assert len(output.finished_req_ids) == 0
    for req_id, num_tokens in output.num_scheduled_tokens.items():
        assert num_tokens == len(requests[int(req_id)].prompt_token_ids)
    assert output.total_num_scheduled_tokens == 100
    assert len(scheduler.waiting) == 0
    assert len(scheduler.running) == len(requests)
    for i, request in enumerate(requests):
        assert scheduler.running[i] == request
    assert scheduler.get_request_counts() == (10, 0)


def test_chunked_prefill():
    """An 80-token prompt with a 50-token budget: 50, then 30, then decode (vLLM's
    test_no_spec_tokens_scheduled_for_prefill_chunks without the drafts)."""
    scheduler = create_scheduler(max_num_batched_tokens=50, max_model_len=200)
    req = create_requests(num_requests=1, num_tokens=80)[0]
    scheduler.add_request(req)

    output = scheduler.schedule()
    assert output.num_scheduled_tokens[req.request_id] == 50
    assert output.scheduled_new_reqs[0].num_computed_tokens == 0
    eco = scheduler.update_from_output(output, runner_output([req.request_id], [[]]))
    assert eco.outputs == [] and req.num_output_tokens == 0  # a partial chunk samples nothing

    output = scheduler.schedule()
    assert output.num_scheduled_tokens[req.request_id] == 30
    assert output.scheduled_cached_reqs.num_computed_tokens == [50]
    eco = scheduler.update_from_output(output, runner_output([req.request_id], [[42]]))
    assert eco.outputs[0].new_token_ids == [42]

    output = scheduler.schedule()
    assert output.num_scheduled_tokens[req.request_id] == 1
    assert output.scheduled_cached_reqs.num_computed_tokens == [80]


def test_schedule_concurrent_partial_requests():
    """Several long prefills share a step's budget and continue together."""
    scheduler = create_scheduler(max_num_batched_tokens=1024)
    requests = create_requests(num_requests=3, num_tokens=800)
    for request in requests:
        scheduler.add_request(request)

    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == 2
    assert output.num_scheduled_tokens == {"0": 800, "1": 224}
    scheduler.update_from_output(output, runner_output(["0", "1"], [[0], []]))

    output = scheduler.schedule()
    assert output.scheduled_cached_reqs.req_ids == ["0", "1"]
    assert [r.req_id for r in output.scheduled_new_reqs] == ["2"]
    assert output.num_scheduled_tokens == {"0": 1, "1": 576, "2": 447}


def test_stop_via_update_from_output():
    # Stop on EOS.
    scheduler = create_scheduler()
    requests = create_requests(num_requests=2, max_tokens=10)
    for req in requests:
        scheduler.add_request(req)
    output = scheduler.schedule()
    scheduler.update_from_output(output, runner_output(["0", "1"], [[EOS_TOKEN_ID], [10]]))
    assert len(scheduler.running) == 1
    assert scheduler.running[0].request_id == requests[1].request_id
    assert requests[0].status == RequestStatus.FINISHED_STOPPED
    assert requests[0].request_id in scheduler.finished_req_ids
    assert list(requests[0].output_token_ids) == [EOS_TOKEN_ID]
    assert list(requests[1].output_token_ids) == [10]

    # Stop on a custom stop token: stop_reason is the token.
    scheduler = create_scheduler()
    requests = create_requests(num_requests=2, max_tokens=10, stop_token_ids=[42, 43])
    for req in requests:
        scheduler.add_request(req)
    output = scheduler.schedule()
    eco = scheduler.update_from_output(output, runner_output(["0", "1"], [[42], [13]]))
    assert len(scheduler.running) == 1
    assert scheduler.running[0].request_id == requests[1].request_id
    assert requests[0].status == RequestStatus.FINISHED_STOPPED
    assert requests[0].stop_reason == 42
    assert eco.outputs[0].finish_reason == FinishReason.STOP and eco.outputs[0].stop_reason == 42
    assert eco.outputs[1].finish_reason is None
    assert list(requests[0].output_token_ids) == [42]

    # Stop on max_tokens.
    scheduler = create_scheduler()
    requests = create_requests(num_requests=2, max_tokens=2)
    for req in requests:
        scheduler.add_request(req)
    output = scheduler.schedule()
    scheduler.update_from_output(output, runner_output(["0", "1"], [[10], [13]]))
    output = scheduler.schedule()
    scheduler.update_from_output(output, runner_output(["0"], [[11]]))
    assert len(scheduler.running) == 1
    assert scheduler.running[0].request_id == requests[1].request_id
    assert requests[0].status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert list(requests[0].output_token_ids) == [10, 11]
    assert list(requests[1].output_token_ids) == [13]

    # ignore_eos: the request continues past EOS.
    scheduler = create_scheduler()
    request = create_requests(num_requests=1, max_tokens=10, ignore_eos=True)[0]
    scheduler.add_request(request)
    for token in (EOS_TOKEN_ID, 10, 11):
        output = scheduler.schedule()
        scheduler.update_from_output(output, runner_output(["0"], [[token]]))
    assert len(scheduler.running) == 1
    assert not request.is_finished()
    assert list(request.output_token_ids) == [EOS_TOKEN_ID, 10, 11]


def test_multi_token_output_is_cut_at_the_first_stop():
    """A step that hands a request several tokens (speculative-style) keeps them up to the first
    that ends it, and no further: a stop token, EOS, or max_tokens."""
    scheduler = create_scheduler()
    stop_tok, eos = create_requests(num_requests=2, max_tokens=10, stop_token_ids=[42])
    (capped,) = create_requests(num_requests=1, max_tokens=3, starting_idx=2)
    for req in (stop_tok, eos, capped):
        scheduler.add_request(req)
    output = scheduler.schedule()
    eco = scheduler.update_from_output(output, runner_output(
        ["0", "1", "2"], [[7, 42, 9, 10], [8, EOS_TOKEN_ID, 11], [1, 2, 3, 4, 5]]))
    by_id = {o.request_id: o for o in eco.outputs}
    assert by_id["0"].new_token_ids == [7, 42] and list(stop_tok.output_token_ids) == [7, 42]
    assert by_id["0"].finish_reason == FinishReason.STOP and by_id["0"].stop_reason == 42
    assert by_id["1"].new_token_ids == [8, EOS_TOKEN_ID]
    assert by_id["1"].finish_reason == FinishReason.STOP and by_id["1"].stop_reason is None
    assert by_id["2"].new_token_ids == [1, 2, 3] and list(capped.output_token_ids) == [1, 2, 3]
    assert by_id["2"].finish_reason == FinishReason.LENGTH
    assert eco.finished_requests == {"0", "1", "2"}
    assert_scheduler_empty(scheduler)
    # Several tokens that end nothing are all kept.
    (req,) = create_requests(num_requests=1, max_tokens=10, stop_token_ids=[42], req_ids=["x"])
    scheduler.add_request(req)
    output = scheduler.schedule()
    eco = scheduler.update_from_output(output, runner_output(["x"], [[5, 6, 7]]))
    assert eco.outputs[0].new_token_ids == [5, 6, 7] and eco.outputs[0].finish_reason is None
    assert list(req.output_token_ids) == [5, 6, 7]


def test_stop_via_max_model_len():
    scheduler = create_scheduler(max_num_batched_tokens=64, max_model_len=14)
    request = create_requests(num_requests=1, num_tokens=10, max_tokens=100)[0]
    scheduler.add_request(request)
    steps = 0
    while scheduler.has_unfinished_requests():
        output = scheduler.schedule()
        # num_computed_tokens already counts this step: input positions stay <= 14 - 2.
        for req_id in output.num_scheduled_tokens:
            assert scheduler.requests[req_id].num_computed_tokens <= 14 - 1
        eco = scheduler.update_from_output(output, output_for(output, token_id=5))
        steps += 1
    assert steps == 4
    assert request.num_tokens == 14
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert eco.outputs[0].finish_reason == FinishReason.LENGTH


@pytest.mark.parametrize(("enable_prefix_caching", "prompt_logprobs"),
                         CACHING_AND_PROMPT_LOGPROBS)
def test_schedule_concurrent_batches(enable_prefix_caching: bool, prompt_logprobs: int | None):
    scheduler = create_scheduler(
        max_num_batched_tokens=1024, max_num_seqs=2, enable_prefix_caching=enable_prefix_caching
    )
    requests = create_requests(num_requests=2, num_tokens=512, prompt_logprobs=prompt_logprobs)

    scheduler.add_request(requests[0])
    output0 = scheduler.schedule()
    assert len(output0.scheduled_new_reqs) == 1
    assert output0.num_scheduled_tokens[requests[0].request_id] == 512

    # The first request is still running, so only the second one is scheduled.
    scheduler.add_request(requests[1])
    output1 = scheduler.schedule()
    assert len(output1.scheduled_new_reqs) == 1
    assert output1.num_scheduled_tokens[requests[1].request_id] == 512

    scheduler.update_from_output(output0, runner_output([requests[0].request_id], [[0]]))
    # The first request can be scheduled again while the second one is still running.
    output2 = scheduler.schedule()
    assert output2.num_scheduled_tokens[requests[0].request_id] == 1
    scheduler.update_from_output(output1, runner_output([requests[1].request_id], [[0]]))


@pytest.mark.parametrize("enable_chunked_prefill", [True, False])
def test_schedule_order(enable_chunked_prefill: bool):
    scheduler = create_scheduler(
        max_num_batched_tokens=1024, max_num_seqs=3, enable_chunked_prefill=enable_chunked_prefill
    )
    requests = create_requests(num_requests=2, num_tokens=800, req_ids=["1", "2"])
    requests += create_requests(num_requests=2, num_tokens=10, req_ids=["3", "4"])
    for request in requests:
        scheduler.add_request(request)

    output = scheduler.schedule()
    if enable_chunked_prefill:
        # Long requests are chunked.
        assert len(output.scheduled_new_reqs) == 2
    else:
        # A long request that does not fit waits, and the short ones behind it wait too.
        assert len(output.scheduled_new_reqs) == 1


def test_preempt_during_execution():
    # 11 blocks, of which 10 usable: block 0 is the null block.
    scheduler = create_scheduler(
        max_num_batched_tokens=100, block_size=16, num_blocks=11, enable_prefix_caching=False
    )
    requests = create_requests(num_requests=2, num_tokens=80, block_size=16)

    scheduler.add_request(requests[0])
    output0 = scheduler.schedule()
    assert len(output0.num_scheduled_tokens) == 1
    assert len(output0.scheduled_new_reqs[0].block_ids) == 5

    # The second request is scheduled while the first one's step is still running
    # (max_concurrent_batches > 1).
    scheduler.add_request(requests[1])
    output1 = scheduler.schedule()
    assert len(output1.num_scheduled_tokens) == 1
    assert len(output1.scheduled_new_reqs[0].block_ids) == 5

    scheduler.update_from_output(output0, runner_output([requests[0].request_id], [[0]]))

    # Scheduling the first request again needs a block: the second one is preempted.
    output2 = scheduler.schedule()
    assert len(scheduler.running) == 1
    assert scheduler.running[0] == requests[0]
    assert requests[1].status == RequestStatus.PREEMPTED
    assert output2.preempted_req_ids == {requests[1].request_id}
    assert requests[1].num_preemptions == 1 and scheduler.num_preemptions == 1

    # The preempted request still gets the token of the step it was part of.
    scheduler.update_from_output(output1, runner_output([requests[1].request_id], [[42]]))
    assert list(requests[1].output_token_ids) == [42]


def test_preempted_request_resumes_as_new_request_with_its_tokens():
    scheduler = create_scheduler(
        max_num_batched_tokens=100, block_size=16, num_blocks=11, enable_prefix_caching=False
    )
    req0, req1 = create_requests(num_requests=2, num_tokens=79, block_size=16)
    scheduler.add_request(req0)
    scheduler.add_request(req1)
    output = scheduler.schedule()  # req0 79 tokens, req1 21 tokens (budget 100)
    scheduler.update_from_output(output, runner_output(["0", "1"], [[7], []]))
    output = scheduler.schedule()  # req0 decodes (5 blocks), req1 gets 58 more: 10 blocks
    assert output.num_scheduled_tokens == {"0": 1, "1": 58}
    scheduler.update_from_output(output, runner_output(["0", "1"], [[8], [9]]))
    # req0 needs a 6th block: the last running request (req1) is preempted.
    output = scheduler.schedule()
    assert output.preempted_req_ids == {"1"}
    assert output.num_scheduled_tokens == {"0": 1}
    assert not output.scheduled_new_reqs  # waiting requests never preempt, nor resume here
    scheduler.finish_requests("0", RequestStatus.FINISHED_ABORTED)
    output = scheduler.schedule()
    assert output.finished_req_ids == {"0"}
    (resumed,) = output.scheduled_new_reqs
    assert resumed.req_id == "1"
    assert resumed.prompt_token_ids == [1] * 79
    assert resumed.output_token_ids == [9]
    assert resumed.num_computed_tokens == 0
    assert output.num_scheduled_tokens == {"1": 80}
    assert len(resumed.block_ids) == 5


def test_waiting_request_does_not_preempt_running():
    scheduler = create_scheduler(num_blocks=5, block_size=16, enable_prefix_caching=False)
    req0, req1 = create_requests(num_requests=2, num_tokens=40)
    scheduler.add_request(req0)
    scheduler.schedule()  # 3 of the 4 usable blocks
    scheduler.add_request(req1)
    output = scheduler.schedule()
    assert not output.num_scheduled_tokens  # req0's step is in flight; req1 does not fit
    assert req1.status == RequestStatus.WAITING and req0.status == RequestStatus.RUNNING


def test_scheduler_reset_prefix_cache():
    scheduler = create_scheduler(enable_prefix_caching=True)
    requests = create_requests(num_requests=10)
    for request in requests:
        scheduler.add_request(request)
    scheduler.schedule()
    assert len(scheduler.waiting) == 0
    assert len(scheduler.running) == len(requests)

    # Running requests hold KV blocks: a plain reset fails.
    assert not scheduler.reset_prefix_cache()
    # Forcing it preempts every running request back to the waiting queue.
    assert scheduler.reset_prefix_cache(reset_running_requests=True)
    assert len(scheduler.waiting) == len(requests)
    assert len(scheduler.running) == 0
    for i, request in enumerate(requests):
        assert scheduler.waiting[i] == request
    # The runner learns about the preemption in the next step.
    output = scheduler.schedule()
    assert output.preempted_req_ids == {r.request_id for r in requests}
    assert len(output.scheduled_new_reqs) == 10


def test_prefix_cache_hits_are_counted_on_admission():
    block_size = 16
    scheduler = create_scheduler(enable_prefix_caching=True, block_size=block_size)
    seed = create_requests(
        num_requests=1, num_tokens=block_size * 2, max_tokens=2, same_prompt=True, req_ids=["s"]
    )[0]
    scheduler.add_request(seed)
    while scheduler.has_unfinished_requests():
        output = scheduler.schedule()
        scheduler.update_from_output(output, output_for(output, token_id=1000))
    stats = scheduler.make_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (32, 0)

    request = create_requests(
        num_requests=1, num_tokens=block_size * 3, max_tokens=1, same_prompt=True, req_ids=["r"]
    )[0]
    scheduler.add_request(request)
    output = scheduler.schedule()
    assert output.num_scheduled_tokens == {"r": 16}
    assert output.scheduled_new_reqs[0].num_computed_tokens == 32
    assert request.num_cached_tokens == 32
    stats = scheduler.make_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (32 + 48, 32)
    eco = scheduler.update_from_output(output, output_for(output))
    assert eco.outputs[0].num_cached_tokens == 32
    assert eco.scheduler_stats.prefix_cache_hits == 32


def test_prefix_cache_stats_not_recorded_when_caching_disabled():
    scheduler = create_scheduler(enable_prefix_caching=False)
    for request in create_requests(num_requests=2):
        scheduler.add_request(request)
    scheduler.schedule()
    stats = scheduler.make_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (0, 0)


def test_logprobs_are_copied_for_requests_that_ask():
    scheduler = create_scheduler()
    req0, req1 = create_requests(num_requests=2)
    req0.sampling_params.logprobs = 2
    scheduler.add_request(req0)
    scheduler.add_request(req1)
    output = scheduler.schedule()
    runner = ModelRunnerOutput(
        req_ids=["1", "0"],
        req_id_to_index={"1": 0, "0": 1},
        sampled_token_ids=[[5], [6]],
        logprobs=LogprobsLists(
            logprob_token_ids=[[5, 1, 2], [6, 3, 4]],
            logprobs=[[-0.1, -1.0, -2.0], [-0.2, -1.5, -2.5]],
            sampled_token_ranks=[1, 1],
        ),
    )
    eco = scheduler.update_from_output(output, runner)
    by_id = {o.request_id: o for o in eco.outputs}
    assert by_id["0"].new_token_ids == [6]
    assert by_id["0"].new_logprobs == [([6, 3, 4], [-0.2, -1.5, -2.5], 1)]
    assert by_id["1"].new_logprobs is None


def test_scheduler_output_protocol():
    """New requests carry full block tables; cached ones carry only appended blocks."""
    scheduler = create_scheduler(block_size=4)
    request = create_requests(num_requests=1, num_tokens=6, block_size=4)[0]
    scheduler.add_request(request)
    output = scheduler.schedule()
    assert output.scheduled_new_reqs[0].block_ids == [1, 2]
    scheduler.update_from_output(output, output_for(output))  # 7 tokens
    output = scheduler.schedule()
    assert output.scheduled_cached_reqs.new_block_ids == [None]
    scheduler.update_from_output(output, output_for(output))  # 8 tokens
    output = scheduler.schedule()
    assert output.scheduled_cached_reqs.new_block_ids == [None]  # position 7 fits block 2
    scheduler.update_from_output(output, output_for(output))  # 9 tokens
    output = scheduler.schedule()
    assert output.scheduled_cached_reqs.new_block_ids == [[3]]
    assert scheduler.kv_cache_manager.get_block_ids("0") == [1, 2, 3]


def test_memory_leak():
    scheduler = create_scheduler(enable_prefix_caching=True)
    requests = create_requests(num_requests=5, num_tokens=10, max_tokens=10)
    for request in requests:
        scheduler.add_request(request)
        output = scheduler.schedule()
        scheduler.update_from_output(output, output_for(output, token_id=1000))
    while True:
        output = scheduler.schedule()
        if len(scheduler.running) == 0:
            break
        scheduler.update_from_output(output, output_for(output, token_id=1000))
    assert_scheduler_empty(scheduler)
    assert len(scheduler.finished_req_ids) == 0


def test_unknown_policy_is_an_error():
    with pytest.raises(ValueError, match="scheduling_policy"):
        Scheduler(SchedulerConfig(policy="sjf"), CacheConfig(), 10)


def test_a_request_waits_for_its_grammar_while_others_run() -> None:
    """vLLM's WAITING_FOR_FSM: a request whose grammar has not compiled is skipped, keeps its
    place in the queue, and is scheduled in order once the grammar is ready."""
    from cadence.scheduler.stall import stall_reason

    scheduler = create_scheduler()
    first, second, third = create_requests(3)
    ready = {"flag": False}
    first._grammar_ready = lambda: ready["flag"]
    for request in (first, second, third):
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert [r.req_id for r in out.scheduled_new_reqs] == [second.request_id, third.request_id]
    assert [r.request_id for r in scheduler.waiting] == [first.request_id]
    ready["flag"] = True
    out = scheduler.schedule()
    assert [r.req_id for r in out.scheduled_new_reqs] == [first.request_id]
    assert first.waiting_for_grammar is False

    alone = create_scheduler()
    (only,) = create_requests(1)
    only._grammar_ready = lambda: False
    alone.add_request(only)
    assert alone.schedule().total_num_scheduled_tokens == 0
    assert stall_reason(alone) is None  # compiling, not stalled


def test_requests_waiting_for_their_grammars_keep_their_order() -> None:
    """Two requests skipped while their grammars compile go back to the queue's front in
    their own order: once both are ready, one seat admits the first (FCFS)."""
    scheduler = create_scheduler(max_num_seqs=1)
    first, second = create_requests(2)
    ready = {"flag": False}
    for request in (first, second):
        request._grammar_ready = lambda: ready["flag"]
        scheduler.add_request(request)
    assert scheduler.schedule().total_num_scheduled_tokens == 0
    assert [r.request_id for r in scheduler.waiting] == [first.request_id, second.request_id]
    ready["flag"] = True
    out = scheduler.schedule()
    assert [r.req_id for r in out.scheduled_new_reqs] == [first.request_id]


def test_queue_timing_goes_out_with_a_requests_first_output_only():
    """The (queued, first scheduled) times do not change after the first schedule, so they
    cross the process boundary once, not with every step's output."""
    scheduler = create_scheduler()
    (request,) = create_requests(num_requests=1, max_tokens=3)
    scheduler.add_request(request)
    timings = []
    for _ in range(3):
        output = scheduler.schedule()
        eco = scheduler.update_from_output(output, output_for(output))
        timings += [o.timing for o in eco.outputs]
    assert len(timings) == 3
    assert timings[0] == (request.queued_time, request.scheduled_time)
    assert timings[0][1] is not None and timings[1:] == [None, None]


def test_a_request_without_max_tokens_fills_the_context() -> None:
    """vLLM: max_tokens None means what the context leaves, max_model_len - prompt tokens (a
    5-token prompt in a 12-token context: 7 tokens, finished by length)."""
    scheduler = create_scheduler(max_model_len=12, max_num_batched_tokens=64, block_size=4)
    (request,) = create_requests(1, num_tokens=5, max_tokens=None, block_size=4, ignore_eos=True)
    scheduler.add_request(request)
    tokens, finish = 0, None
    for _ in range(20):
        so = scheduler.schedule()
        for out in scheduler.update_from_output(so, output_for(so, 3)).outputs:
            tokens += len(out.new_token_ids)
            finish = out.finish_reason or finish
        if finish is not None:
            break
    assert (tokens, finish) == (7, FinishReason.LENGTH)
