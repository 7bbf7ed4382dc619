"""Preemption and resumption details that vLLM's scheduler fixes (its tests/v1/core semantics):
which equal-priority request is the victim, what a resumed request finds in the prefix cache,
and the first admission's figures kept through a resume; a prompt that exactly fills the step's
remaining budget without chunked prefill."""

from __future__ import annotations

from cadence.scheduler.request import RequestStatus
from tests.scheduler.factories import create_requests, create_scheduler, output_for, runner_output


def test_the_later_arrival_of_equal_priority_is_preempted():
    """Priority policy: the victim is the running request with the largest (priority, arrival
    time): of two with one priority, the later arrival."""
    scheduler = create_scheduler(policy="priority", enable_prefix_caching=False, num_blocks=4,
                                 block_size=16)
    early, late = create_requests(2, num_tokens=16, priorities=[1, 1], arrival_times=[1.0, 2.0])
    for request in (early, late):
        scheduler.add_request(request)
    out = scheduler.schedule()  # one block each; one block is left
    scheduler.update_from_output(out, output_for(out))
    out = scheduler.schedule()  # each needs a second block: only one is free
    assert scheduler.requests[late.request_id].status == RequestStatus.PREEMPTED
    assert scheduler.requests[early.request_id].status == RequestStatus.RUNNING
    assert list(out.num_scheduled_tokens) == [early.request_id]


def test_a_prompt_that_fills_the_remaining_budget_exactly_is_scheduled():
    scheduler = create_scheduler(max_num_batched_tokens=64, max_model_len=64,
                                 enable_chunked_prefill=False)
    (first,) = create_requests(1, num_tokens=10, max_tokens=8)
    scheduler.add_request(first)
    out = scheduler.schedule()
    scheduler.update_from_output(out, output_for(out))
    (second,) = create_requests(1, num_tokens=63, max_tokens=1, starting_idx=1)
    scheduler.add_request(second)
    out = scheduler.schedule()  # one decode token + 63 prompt tokens = the budget of 64
    assert out.num_scheduled_tokens == {first.request_id: 1, second.request_id: 63}


def test_a_resumed_request_hits_its_cached_blocks_and_keeps_its_first_figures():
    """A request preempted after two decode steps resumes with every full block of its prompt
    and output found in the prefix cache; its num_cached_tokens and scheduled_time stay those
    of its first admission, and its lookup on resumption is counted apart from first
    admissions' (vLLM's preempted_* figures: the hit rate does not count a victim's own
    blocks)."""
    block = 4
    scheduler = create_scheduler(num_blocks=6, block_size=block, max_num_batched_tokens=64)
    a, b = create_requests(2, num_tokens=7, max_tokens=32, block_size=block)
    for request in (a, b):
        scheduler.add_request(request)
    out = scheduler.schedule()  # 2 blocks each, 1 of 5 usable left
    first_time = b.scheduled_time
    assert first_time is not None and b.num_cached_tokens == 0
    scheduler.update_from_output(out, runner_output([a.request_id, b.request_id], [[100], [101]]))
    out = scheduler.schedule()  # position 7 fits the second block
    scheduler.update_from_output(out, runner_output([a.request_id, b.request_id], [[102], [103]]))
    out = scheduler.schedule()  # position 8: a takes the last block, b is preempted (fcfs)
    assert b.status == RequestStatus.PREEMPTED
    scheduler.update_from_output(out, runner_output([a.request_id], [[104]]))
    scheduler.finish_requests(a.request_id, RequestStatus.FINISHED_STOPPED)

    tokens = b.num_tokens  # 7 prompt + 2 output
    assert tokens == 9
    out = scheduler.schedule()
    (resumed,) = out.scheduled_new_reqs
    hit = (tokens - 1) // block * block  # every full block but the one the last token is in
    assert resumed.num_computed_tokens == hit == 8
    assert out.num_scheduled_tokens == {b.request_id: tokens - hit}
    assert b.num_cached_tokens == 0 and b.scheduled_time == first_time
    stats = scheduler.make_stats()
    assert stats.prefix_cache_queries == 7 + 7
    assert stats.prefix_cache_hits == 0
    kv_stats = scheduler.kv_cache_manager.prefix_cache_stats
    assert (kv_stats.preempted_requests, kv_stats.preempted_queries,
            kv_stats.preempted_hits) == (1, tokens, hit)
