"""Further vLLM scheduler tests, ported with the same inputs and expected outcomes (only API
names adapted): from tests/v1/core/test_scheduler.py, test_prefix_caching.py and
test_priority_scheduler_random.py."""

from __future__ import annotations

import random
import uuid

import pytest

from cadence.sampling_params import SamplingParams
from cadence.scheduler.block_hash import make_block_hasher
from cadence.scheduler.block_pool import BlockPool
from cadence.scheduler.kv_cache_manager import KVCacheManager
from cadence.scheduler.request import Request, RequestStatus
from tests.scheduler.factories import (
    EOS_TOKEN_ID,
    create_requests,
    create_scheduler,
    runner_output,
)


# test_scheduler.py: test_preemption_re_records_prefix_cache_query ---------------------------
def test_preemption_re_records_prefix_cache_query():
    """A preempted request re-enters the lookup on resume, so its recomputation is counted
    again into the preempted stats."""
    scheduler = create_scheduler(enable_prefix_caching=True)
    request = create_requests(num_requests=1)[0]
    scheduler.add_request(request)

    scheduler_output = scheduler.schedule()
    stats = scheduler.kv_cache_manager.prefix_cache_stats
    assert (stats.requests, stats.preempted_requests) == (1, 0)

    scheduler.running.remove(request)
    scheduler._preempt_request(request)
    assert request.status == RequestStatus.PREEMPTED

    scheduler.update_from_output(scheduler_output, runner_output([request.request_id], [[1000]]))
    assert request.num_stale_output_tokens == 0

    scheduler.schedule()
    assert request.status == RequestStatus.RUNNING
    assert stats.preempted_requests == 1


# test_scheduler.py: test_stop_via_update_from_output (multi-token rows, no spec config) ------
def _running(scheduler, requests):
    for req in requests:
        scheduler.add_request(req)
    return scheduler.schedule()


def test_stop_via_update_from_output_multi_token():
    # Case 1: stop on EOS; the second request takes two tokens and continues.
    scheduler = create_scheduler()
    requests = create_requests(num_requests=2, max_tokens=10)
    out = _running(scheduler, requests)
    scheduler.update_from_output(out, runner_output(["0", "1"], [[EOS_TOKEN_ID], [10, 11]]))
    assert len(scheduler.running) == 1
    assert scheduler.running[0].request_id == requests[1].request_id
    assert requests[0].status == RequestStatus.FINISHED_STOPPED
    assert requests[0].request_id in scheduler.finished_req_ids
    assert list(requests[0].output_token_ids) == [EOS_TOKEN_ID]
    assert list(requests[1].output_token_ids) == [10, 11]

    # Case 2: stop on custom stop token within a multi-token row.
    scheduler = create_scheduler()
    requests = create_requests(num_requests=2, max_tokens=10, stop_token_ids=[42, 43])
    out = _running(scheduler, requests)
    scheduler.update_from_output(out, runner_output(["0", "1"], [[10, 42, 12], [13, 14]]))
    assert len(scheduler.running) == 1
    assert scheduler.running[0].request_id == requests[1].request_id
    assert requests[0].status == RequestStatus.FINISHED_STOPPED
    assert requests[0].stop_reason == 42
    assert requests[0].request_id in scheduler.finished_req_ids
    assert list(requests[0].output_token_ids) == [10, 42]
    assert list(requests[1].output_token_ids) == [13, 14]

    # Case 3: stop on max tokens, truncated.
    scheduler = create_scheduler()
    requests = create_requests(num_requests=2, max_tokens=2)
    out = _running(scheduler, requests)
    scheduler.update_from_output(out, runner_output(["0", "1"], [[10, 11, 12], [13]]))
    assert len(scheduler.running) == 1
    assert scheduler.running[0].request_id == requests[1].request_id
    assert requests[0].status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert requests[0].request_id in scheduler.finished_req_ids
    assert list(requests[0].output_token_ids) == [10, 11]
    assert list(requests[1].output_token_ids) == [13]

    # Case 4: ignore EOS within a multi-token row.
    scheduler = create_scheduler()
    requests = create_requests(num_requests=1, max_tokens=10, ignore_eos=True)
    out = _running(scheduler, requests)
    scheduler.update_from_output(out, runner_output(["0"], [[EOS_TOKEN_ID, 10, 11]]))
    assert len(scheduler.running) == 1
    assert not requests[0].is_finished()
    assert list(requests[0].output_token_ids) == [EOS_TOKEN_ID, 10, 11]


# test_prefix_caching.py: test_reset_prefix_cache (exact) ------------------------------------
def _make_request(request_id, prompt_token_ids, block_size=16):
    return Request(request_id, prompt_token_ids, SamplingParams(max_tokens=17),
                   eos_token_id=100, block_hasher=make_block_hasher(block_size))


def test_reset_prefix_cache_exact():
    manager = KVCacheManager(11, 16, True, max_model_len=8192)
    full_block_token_ids = [i for i in range(3) for _ in range(16)]
    req0 = _make_request("0", full_block_token_ids + [3] * 7)
    blocks = manager.allocate_slots(req0, 55)
    assert [b.block_id for b in blocks] == [1, 2, 3, 4]

    req1 = _make_request("1", full_block_token_ids + [4] * 7)
    computed_blocks, _ = manager.get_computed_blocks(req1)
    assert len(req1.block_hashes) == 3
    assert len(computed_blocks) == 3
    blocks = manager.allocate_slots(req1, 7, len(computed_blocks) * 16, computed_blocks)
    assert [b.block_id for b in blocks] == [5]

    assert not manager.reset_prefix_cache()
    assert manager.block_pool.cached_block_hash_to_block

    manager.free(req0)
    manager.free(req1)

    assert manager.reset_prefix_cache()
    assert not manager.block_pool.cached_block_hash_to_block
    assert all(blk.block_hash is None for blk in manager.block_pool.blocks)


# test_prefix_caching.py: test_block_lookup_cache_{single,multi}_block(s)_per_key -----------
# vLLM's BlockHashToBlockMap is cadence's BlockPool.cached_block_hash_to_block (a dict of
# dicts); get_one_block -> get_cached_block, insert -> cache_full_blocks, pop(key, id) ->
# _evict_cached_block (which pops a given block, so the id-mismatch no-ops are checked as
# "the other block stays").
def test_block_lookup_cache_multi_blocks_per_key():
    pool = BlockPool(num_blocks=5, enable_caching=True)
    key0, key1 = b"hash0" * 7, b"hash1" * 7
    b00, b01, b10, b11 = pool.get_new_blocks(4)
    assert pool.get_cached_block(key0) is None and pool.get_cached_block(key1) is None
    pool.cache_full_blocks([b00, b01, b10, b11], [key0, key0, key1, key1], 0, 4)
    assert pool.get_cached_block(key0) is b00
    pool._evict_cached_block(b00)
    assert pool.get_cached_block(key0) is b01
    pool._evict_cached_block(b01)
    assert pool.get_cached_block(key0) is None
    assert pool.get_cached_block(key1) is b10
    pool._evict_cached_block(b10)
    assert pool.get_cached_block(key1) is b11
    pool._evict_cached_block(b11)
    assert pool.get_cached_block(key1) is None


# test_priority_scheduler_random.py: test_priority_scheduling_blast (no spec, no mm) ---------
def _create_random_request(max_tokens_range, num_tokens_range, arrival_time_range,
                           priority_range, block_size):
    max_tokens = random.randint(*max_tokens_range)
    num_tokens = random.randint(*num_tokens_range)
    priority = random.randint(*priority_range)
    arrival_time = random.uniform(*arrival_time_range)
    request_id = uuid.uuid4().hex
    prompt_token_ids = random.choices(range(100), k=num_tokens)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=SamplingParams(ignore_eos=False, max_tokens=max_tokens),
        eos_token_id=EOS_TOKEN_ID,
        arrival_time=arrival_time,
        priority=priority,
        block_hasher=make_block_hasher(block_size),
    )


def _mock_execute_model(scheduler_output, num_output_tokens_range):
    request_ids = [req.req_id for req in scheduler_output.scheduled_new_reqs]
    request_ids.extend(scheduler_output.scheduled_cached_reqs.req_ids)
    random.shuffle(request_ids)
    num_output_tokens = [random.randint(*num_output_tokens_range) for _ in request_ids]
    sampled = [[random.randint(0, 100) for _ in range(n)] for n in num_output_tokens]
    return runner_output(request_ids, sampled)


def _check_valid_scheduler_output(scheduler_output, seen_request_ids, preempted_ids):
    for req in scheduler_output.scheduled_new_reqs:
        # NOTE adapted: cadence sends a resumed (preempted) request as new (vLLM's V2 runner
        # does too); vLLM V1 sends it among the cached ones.
        assert req.req_id not in seen_request_ids or req.req_id in preempted_ids
        seen_request_ids.add(req.req_id)
    for req_id in scheduler_output.scheduled_cached_reqs.req_ids:
        assert req_id in seen_request_ids
    req_ids = {req.req_id for req in scheduler_output.scheduled_new_reqs}
    req_ids.update(scheduler_output.scheduled_cached_reqs.req_ids)
    assert set(scheduler_output.num_scheduled_tokens) == req_ids
    assert (sum(scheduler_output.num_scheduled_tokens.values())
            == scheduler_output.total_num_scheduled_tokens)
    assert scheduler_output.finished_req_ids <= seen_request_ids
    preempted_ids |= scheduler_output.preempted_req_ids


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
@pytest.mark.parametrize(
    ("max_input_tokens", "max_output_tokens", "max_num_seqs", "num_blocks"),
    [(5000, 500, 256, 10000), (500, 5000, 1024, 1000)],
    ids=["standard", "preemption"],
)
def test_priority_scheduling_blast(enable_prefix_caching, max_input_tokens, max_output_tokens,
                                   max_num_seqs, num_blocks):
    random.seed(42)
    seen_request_ids: set[str] = set()
    preempted_ids: set[str] = set()
    scheduler = create_scheduler(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=8192,
        enable_prefix_caching=enable_prefix_caching,
        num_blocks=num_blocks,
        block_size=16,
        policy="priority",
    )

    def new_request():
        return _create_random_request((1, max_output_tokens), (1, max_input_tokens), (0, 1),
                                      (-3, 3), 16)

    for _ in range(10):
        scheduler.add_request(new_request())
    for _ in range(20000):
        if len(scheduler.waiting) == 0:
            for _ in range(random.randint(0, 2)):
                scheduler.add_request(new_request())
        scheduler_output = scheduler.schedule()
        _check_valid_scheduler_output(scheduler_output, seen_request_ids, preempted_ids)
        model_output = _mock_execute_model(scheduler_output, (1, 1))
        scheduler.update_from_output(scheduler_output, model_output)
