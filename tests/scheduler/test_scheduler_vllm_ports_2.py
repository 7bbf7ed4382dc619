"""More of vLLM's tests/v1/core/test_scheduler.py (and test_scheduler_e2e.py), ported with the
same inputs and expected outcomes (vLLM's test_scheduler_e2e.py is in
tests/engine/test_scheduler_e2e.py). Each test names the vLLM test it mirrors; where vLLM's test
also covers a feature cadence lacks (skipped_waiting queues, KV connectors, per-interval stats),
only the part that applies is kept and the docstring says what was left out. test_schedule and
test_schedule_concurrent_batches with prompt logprobs are parametrizations in test_scheduler.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cadence.scheduler.block_pool import KVCacheBlock
from cadence.scheduler.request import Request, RequestStatus
from cadence.scheduler.scheduler import Scheduler
from tests.scheduler.factories import create_requests, create_scheduler, runner_output


def _stats(scheduler: Scheduler) -> tuple[int, int, int]:
    stats = scheduler.kv_cache_manager.prefix_cache_stats
    return stats.requests, stats.queries, stats.hits


def test_prefix_cache_stats_counted_once_for_retried_then_scheduled_request(
    monkeypatch: pytest.MonkeyPatch,
):
    """vLLM's test of the same name. vLLM's stats restart after each make_stats(); cadence's are
    cumulative, so the same expected values are checked as increments over the seeding run."""
    block_size = 16
    scheduler = create_scheduler(
        enable_prefix_caching=True, enable_chunked_prefill=False, block_size=block_size
    )
    (seed,) = create_requests(
        num_requests=1, num_tokens=block_size * 2, max_tokens=2, same_prompt=True,
        block_size=block_size, req_ids=["seed"],
    )
    scheduler.add_request(seed)
    while scheduler.has_unfinished_requests():
        output = scheduler.schedule()
        scheduler.update_from_output(output, runner_output(["seed"], [[1000]]))
    assert seed.status == RequestStatus.FINISHED_LENGTH_CAPPED
    base = _stats(scheduler)

    def recorded() -> tuple[int, ...]:
        return tuple(now - before for now, before in zip(_stats(scheduler), base))

    (retried,) = create_requests(
        num_requests=1, num_tokens=block_size * 3, max_tokens=1, same_prompt=True,
        block_size=block_size, req_ids=["retried"],
    )
    scheduler.add_request(retried)

    # The first allocation attempt is refused, the next ones go to the real allocator.
    kv = scheduler.kv_cache_manager
    real_allocate: Callable[..., list[KVCacheBlock] | None] = kv.allocate_slots
    results: list[list[KVCacheBlock] | None] = []

    def allocate_once_refused(*args, **kwargs) -> list[KVCacheBlock] | None:
        result = real_allocate(*args, **kwargs) if results else None
        results.append(result)
        return result

    monkeypatch.setattr(kv, "allocate_slots", allocate_once_refused)

    assert not scheduler.schedule().scheduled_new_reqs
    assert recorded() == (0, 0, 0)

    assert "retried" in scheduler.schedule().num_scheduled_tokens
    assert results[0] is None and results[1] is not None
    assert recorded() == (1, retried.num_tokens, block_size * 2)


def test_scheduler_stats_waiting_queue():
    """vLLM's test_scheduler_stats_waiting_queues without its skipped_waiting queue (cadence
    keeps requests waiting on a constraint in the one waiting queue): 3 prompts of 50 tokens, a
    100-token budget, 2 running and 1 waiting in the stats of update_from_output()."""
    scheduler = create_scheduler(max_num_batched_tokens=100)
    for request in create_requests(num_requests=3, num_tokens=50):
        scheduler.add_request(request)

    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == 2
    assert len(scheduler.waiting) == 1

    req_ids = list(output.num_scheduled_tokens)
    eco = scheduler.update_from_output(output, runner_output(req_ids, [[1]] * len(req_ids)))
    stats = eco.scheduler_stats
    assert stats is not None
    assert stats.num_running_reqs == 2
    assert stats.num_waiting_reqs == 1


def test_fcfs_grammar_waiting_requests_keep_order():
    """vLLM's test_fcfs_mixed_skipped_waiting_types_keep_order with its one kind of skipped
    request that cadence has (a grammar still compiling; no remote-KV or streaming inputs).
    max_model_len is raised above the 20-token budget only because cadence's add_request
    refuses prompts of max_model_len tokens (vLLM checks that in its input processor)."""
    scheduler = create_scheduler(max_num_batched_tokens=20, max_model_len=64)

    def make(req_id: str, num_tokens: int = 1) -> Request:
        return create_requests(num_requests=1, num_tokens=num_tokens, req_ids=[req_id])[0]

    grammar, regular, tail = make("grammar"), make("regular", 20), make("tail")
    grammar_ready = {"ready": False}
    grammar._grammar_ready = lambda: grammar_ready["ready"]
    for request in (grammar, regular, tail):
        scheduler.add_request(request)

    first = scheduler.schedule()
    assert [r.req_id for r in first.scheduled_new_reqs] == ["regular"]
    assert [r.request_id for r in scheduler.waiting] == ["grammar", "tail"]

    scheduler.finish_requests("regular", RequestStatus.FINISHED_ABORTED)
    assert not scheduler.running
    grammar_ready["ready"] = True

    second = scheduler.schedule()
    expected_order = ["grammar", "tail"]
    assert [r.req_id for r in second.scheduled_new_reqs] == expected_order
    assert [r.request_id for r in scheduler.running] == expected_order


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_schedule_concurrent_partial_requests(enable_prefix_caching: bool):
    """vLLM's test of the same name: long_prefill_token_threshold lets three long prompts share
    each step's budget (400 + 400 + the 224 left of 1024)."""
    scheduler = create_scheduler(max_num_batched_tokens=1024, long_prefill_token_threshold=400,
                                 enable_prefix_caching=enable_prefix_caching)
    requests = create_requests(num_requests=3, num_tokens=800)
    for request in requests:
        scheduler.add_request(request)
    ids = [r.request_id for r in requests]

    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == 3
    assert output.scheduled_cached_reqs.num_reqs == 0
    assert not output.finished_req_ids
    assert [output.num_scheduled_tokens[i] for i in ids] == [400, 400, 224]
    scheduler.update_from_output(output, runner_output(ids, [[], [], []]))

    # All three run; the first two finish their prompts, the third takes what is left.
    output1 = scheduler.schedule()
    assert len(scheduler.running) == 3
    assert not output1.scheduled_new_reqs and output1.scheduled_cached_reqs.num_reqs == 3
    assert [output1.num_scheduled_tokens[i] for i in ids] == [400, 400, 224]
    scheduler.update_from_output(output1, runner_output(ids, [[0], [0], []]))

    # The first two decode; the third's remaining 352 tokens fit under the threshold.
    output2 = scheduler.schedule()
    assert len(scheduler.running) == 3
    assert not output2.scheduled_new_reqs and output2.scheduled_cached_reqs.num_reqs == 3
    assert [output2.num_scheduled_tokens[i] for i in ids] == [1, 1, 800 - 224 - 224]


def test_long_prefill_token_threshold_is_checked():
    from cadence.config import SchedulerConfig

    with pytest.raises(ValueError, match="at least 0"):
        SchedulerConfig(long_prefill_token_threshold=-1)
    with pytest.raises(ValueError, match="needs chunked prefill"):
        SchedulerConfig(long_prefill_token_threshold=8, enable_chunked_prefill=False,
                        max_num_batched_tokens=8192, max_model_len=4096)


def test_long_prefill_token_threshold_caps_every_chunk_of_a_prompt():
    """The cap holds for a prompt's later chunks too (vLLM applies it to running requests):
    500 tokens under a 1024 budget go as 100 + 100 + 100 + 100 + 100, then a decode."""
    scheduler = create_scheduler(max_num_batched_tokens=1024, long_prefill_token_threshold=100)
    (request,) = create_requests(num_requests=1, num_tokens=500)
    scheduler.add_request(request)
    chunks = []
    for _ in range(6):
        output = scheduler.schedule()
        chunks.append(output.num_scheduled_tokens["0"])
        done = request.num_computed_tokens >= request.num_prompt_tokens
        scheduler.update_from_output(output, runner_output(["0"], [[1] if done else []]))
    assert chunks == [100, 100, 100, 100, 100, 1]
