"""Priority scheduling, ported from vLLM's tests/v1/core/test_scheduler.py: the eleven
test_priority_scheduling_* cases and ..._preemption_and_resumption_when_out_of_kv."""

from __future__ import annotations

import pytest

from cadence.scheduler.output import SchedulerOutput
from cadence.scheduler.request import RequestStatus
from cadence.scheduler.scheduler import Scheduler
from tests.scheduler.factories import create_requests, create_scheduler, runner_output


def create_scheduler_with_priority(
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 8192,
    num_blocks: int = 10000,
    block_size: int = 16,
) -> Scheduler:
    return create_scheduler(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=False,
        num_blocks=num_blocks,
        block_size=block_size,
        policy="priority",
    )


def create_requests_with_priority(
    num_requests: int,
    priorities: list[int],
    arrival_times: list[float] | None = None,
    num_tokens: int = 10,
    starting_idx: int = 0,
    req_ids: list[str] | None = None,
):
    return create_requests(
        num_requests=num_requests,
        num_tokens=num_tokens,
        priorities=priorities,
        arrival_times=arrival_times,
        starting_idx=starting_idx,
        req_ids=req_ids,
    )


def _new_ids(output) -> list[str]:
    return [req.req_id for req in output.scheduled_new_reqs]


def _add_and_schedule(
    scheduler: Scheduler, priorities: list[int], arrival_times: list[float]
) -> SchedulerOutput:
    """Add request ``"i"`` with ``priorities[i]`` and ``arrival_times[i]``, then schedule once."""
    for request in create_requests_with_priority(len(priorities), priorities, arrival_times):
        scheduler.add_request(request)
    return scheduler.schedule()


@pytest.mark.parametrize(
    "priorities,arrival_times,expected",
    [
        pytest.param([2, 0, 1], [1.0, 2.0, 3.0], ["1", "2", "0"], id="basic_ordering"),
        pytest.param([1, 1, 1], [3.0, 1.0, 2.0], ["1", "2", "0"], id="arrival_time_tiebreaker"),
        pytest.param(
            [2, 1, 1, 0],
            [1.0, 3.0, 2.0, 4.0],
            ["3", "2", "1", "0"],
            id="mixed_priority_and_arrival",
        ),
        pytest.param([1, 1, 1, 1], [4.0, 1.0, 3.0, 2.0], ["1", "3", "2", "0"], id="fcfs_fallback"),
    ],
)
def test_priority_scheduling_order(
    priorities: list[int], arrival_times: list[float], expected: list[str]
):
    output = _add_and_schedule(create_scheduler_with_priority(), priorities, arrival_times)
    assert len(output.scheduled_new_reqs) == len(expected)
    assert _new_ids(output) == expected


def test_priority_scheduling_preemption():
    """Under KV pressure the lowest-priority running request is preempted, even when it was
    admitted first and already scheduled in this step.

    block_size 16, 6 blocks (5 usable). lo1 (priority 5, 32 tokens) takes 2 blocks and decodes
    to 33 tokens. hi1 (priority 0, 32 tokens) arrives: lo1 takes its 3rd block, hi1 two more:
    the pool is full. Both decode; hi1 then needs a 3rd block and lo1 is preempted.
    """
    scheduler = create_scheduler_with_priority(
        max_num_seqs=3, max_num_batched_tokens=200, num_blocks=6, block_size=16
    )
    lo1 = create_requests_with_priority(1, [5], [1.0], num_tokens=32, req_ids=["lo1"])[0]
    scheduler.add_request(lo1)
    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == 1
    scheduler.update_from_output(output, runner_output(["lo1"], [[100]]))

    hi1 = create_requests_with_priority(1, [0], [2.0], num_tokens=32, req_ids=["hi1"])[0]
    scheduler.add_request(hi1)
    output = scheduler.schedule()
    assert any(r.req_id == "hi1" for r in output.scheduled_new_reqs)
    assert len(scheduler.running) == 2
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 0
    scheduler.update_from_output(output, runner_output(["lo1", "hi1"], [[101], [100]]))

    output = scheduler.schedule()
    assert scheduler.requests["lo1"].status == RequestStatus.PREEMPTED
    assert any(req.request_id == "hi1" for req in scheduler.running)
    # lo1 had been scheduled before hi1 in this step: it is taken out of the step again.
    assert output.num_scheduled_tokens == {"hi1": 1}
    assert output.total_num_scheduled_tokens == 1
    assert output.preempted_req_ids == {"lo1"}


def test_priority_scheduling_no_preemption_when_space_available():
    scheduler = create_scheduler_with_priority(max_num_seqs=3, max_num_batched_tokens=200)
    low = create_requests_with_priority(
        2, [5, 5], [1.0, 2.0], num_tokens=30, req_ids=["lo1", "lo2"]
    )
    for request in low:
        scheduler.add_request(request)
    output = scheduler.schedule()
    scheduler.update_from_output(output, runner_output(["lo1", "lo2"], [[100], [100]]))

    high = create_requests_with_priority(1, [0], [3.0], num_tokens=30, req_ids=["hi1"])[0]
    scheduler.add_request(high)
    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == 1
    assert len(scheduler.running) == 3
    assert len(scheduler.waiting) == 0


def test_priority_scheduling_preemption_victim_selection():
    scheduler = create_scheduler_with_priority(max_num_seqs=1)
    output = _add_and_schedule(scheduler, [3, 2, 0], [1.0, 2.0, 3.0])
    assert _new_ids(output) == ["2"]
    assert len(scheduler.waiting) == 2
    waiting = list(scheduler.waiting)
    assert [r.priority for r in waiting] == [2, 3]
    assert [r.request_id for r in waiting] == ["1", "0"]


def test_priority_scheduling_equal_priority_preemption():
    scheduler = create_scheduler_with_priority(max_num_seqs=1)
    output = _add_and_schedule(scheduler, [2, 2, 2], [3.0, 1.0, 2.0])
    assert _new_ids(output) == ["1"]
    waiting = list(scheduler.waiting)
    assert [r.arrival_time for r in waiting] == [2.0, 3.0]
    assert [r.request_id for r in waiting] == ["2", "0"]


def test_priority_scheduling_waiting_queue_order():
    scheduler = create_scheduler_with_priority(max_num_seqs=1)
    output = _add_and_schedule(scheduler, [3, 1, 2, 0], [1.0, 2.0, 3.0, 4.0])
    assert _new_ids(output) == ["3"]
    assert len(scheduler.waiting) == 3
    waiting = list(scheduler.waiting)
    assert [r.request_id for r in waiting] == ["1", "2", "0"]
    assert [r.priority for r in waiting] == [1, 2, 3]


def test_priority_scheduling_with_limited_slots():
    scheduler = create_scheduler_with_priority(max_num_seqs=2, max_num_batched_tokens=1000)
    output = _add_and_schedule(scheduler, [3, 1, 2, 0], [1.0, 2.0, 3.0, 4.0])
    assert len(output.scheduled_new_reqs) == 2
    assert set(_new_ids(output)) == {"3", "1"}
    waiting = list(scheduler.waiting)
    assert [r.priority for r in waiting] == [2, 3]
    assert [r.request_id for r in waiting] == ["2", "0"]


def test_priority_scheduling_heap_property():
    scheduler = create_scheduler_with_priority(max_num_seqs=1)
    priorities = [5, 1, 8, 3, 2, 7, 4, 6]
    requests = create_requests_with_priority(
        num_requests=len(priorities),
        priorities=priorities,
        arrival_times=[float(i) for i in range(len(priorities))],
    )
    for request in requests:
        scheduler.add_request(request)

    scheduled_priorities = []
    while scheduler.waiting:
        output = scheduler.schedule()
        if output.scheduled_new_reqs:
            req = output.scheduled_new_reqs[0]
            scheduled_priorities.append(requests[int(req.req_id)].priority)
            scheduler.update_from_output(output, runner_output([req.req_id], [[100]]))
            scheduler.finish_requests(req.req_id, RequestStatus.FINISHED_STOPPED)
    assert scheduled_priorities == sorted(priorities)


def test_priority_scheduling_preemption_and_resumption_when_out_of_kv():
    scheduler = create_scheduler_with_priority(
        max_num_seqs=2,
        max_num_batched_tokens=200,
        num_blocks=5,  # 64 tokens: block 0 is the null block
        block_size=16,
    )
    request_low = create_requests_with_priority(1, [1], [0.0], num_tokens=30, starting_idx=0)[0]
    scheduler.add_request(request_low)
    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == 1
    assert len(scheduler.waiting) == 0
    assert len(scheduler.running) == 1
    scheduler.update_from_output(output, runner_output([request_low.request_id], [[100]]))

    request_high = create_requests_with_priority(1, [0], [1.0], num_tokens=32, starting_idx=1)[0]
    scheduler.add_request(request_high)
    output = scheduler.schedule()
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 0
    assert len(output.scheduled_new_reqs) == 1
    assert output.scheduled_cached_reqs.num_reqs == 1
    assert len(scheduler.waiting) == 0
    assert len(scheduler.running) == 2
    requests = [request_low, request_high]
    ids = [r.request_id for r in requests]
    scheduler.update_from_output(output, runner_output(ids, [[100], [100]]))

    # request_low needs 32 slots (2 blocks), request_high 33 (3 blocks): 5 > 4 usable.
    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == 0
    assert output.scheduled_cached_reqs.num_reqs == 1
    assert output.scheduled_cached_reqs.req_ids[0] == request_high.request_id
    assert scheduler.requests[request_low.request_id].status == RequestStatus.PREEMPTED
    assert len(scheduler.waiting) == 1
    assert len(scheduler.running) == 1

    scheduler.update_from_output(output, runner_output(ids, [[], [100]]))
    scheduler.finish_requests(request_high.request_id, RequestStatus.FINISHED_STOPPED)

    # The preempted request resumes: our runner dropped its state, so it comes back as a new
    # request carrying its generated tokens (vLLM's V2 model runner behaviour).
    output = scheduler.schedule()
    assert len(scheduler.waiting) == 0
    assert len(scheduler.running) == 1
    assert output.scheduled_cached_reqs.num_reqs == 0
    assert len(output.scheduled_new_reqs) == 1
    new_req = output.scheduled_new_reqs[0]
    assert new_req.req_id == request_low.request_id
    all_tokens = new_req.prompt_token_ids + new_req.output_token_ids
    # 30 prompt tokens and 2 decoded tokens.
    assert len(all_tokens) == 32
    assert all_tokens[31] == 100
    assert output.num_scheduled_tokens == {request_low.request_id: 32}
