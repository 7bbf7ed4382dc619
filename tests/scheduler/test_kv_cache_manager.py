"""KV cache manager: allocation, prefix-cache hits, eviction order, stats (ported from vLLM's
tests/v1/core/test_prefix_caching.py: test_prefill, test_decode, test_evict)."""

from __future__ import annotations

from cadence.sampling_params import SamplingParams
from cadence.scheduler.block_hash import ROOT_HASH, hash_block_tokens, make_block_hasher
from cadence.scheduler.kv_cache_manager import KVCacheManager
from cadence.scheduler.request import Request

BLOCK_SIZE = 16


def make_request(request_id: str, prompt_token_ids: list[int]) -> Request:
    return Request(
        request_id,
        prompt_token_ids,
        SamplingParams(max_tokens=17),
        eos_token_id=100,
        block_hasher=make_block_hasher(BLOCK_SIZE),
    )


def make_manager(num_blocks: int = 11, enable_caching: bool = True) -> KVCacheManager:
    return KVCacheManager(num_blocks, BLOCK_SIZE, enable_caching, max_model_len=8192)


def free_ids(manager: KVCacheManager) -> list[int]:
    return [b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()]


def test_prefill():
    manager = make_manager()
    # Complete 3 blocks (48 tokens), then an incomplete block of 7 tokens: a full cache miss.
    common_token_ids = [i for i in range(3) for _ in range(16)]
    all_token_ids = common_token_ids + [3] * 7
    req0 = make_request("0", all_token_ids)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req0)
    assert len(req0.block_hashes) == 3
    assert not computed_blocks
    assert num_computed_tokens == 0
    blocks = manager.allocate_slots(req0, 55, num_computed_tokens, computed_blocks)
    assert [b.block_id for b in blocks] == [1, 2, 3, 4]

    # Full blocks carry the chained hash; the partial one carries none.
    parent = ROOT_HASH
    for block_id in (1, 2, 3):
        block_tokens = all_token_ids[(block_id - 1) * 16 : block_id * 16]
        parent = hash_block_tokens(parent, block_tokens)
        assert manager.block_pool.blocks[block_id].block_hash == parent
        assert manager.block_pool.blocks[block_id].ref_cnt == 1
    assert manager.block_pool.blocks[4].block_hash is None
    assert manager.block_pool.blocks[4].ref_cnt == 1

    # Cache hit in the common prefix while the original blocks are in use.
    req1 = make_request("1", common_token_ids + [3] * 5)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req1)
    assert [b.block_id for b in computed_blocks] == [1, 2, 3]
    assert num_computed_tokens == 3 * 16
    blocks = manager.allocate_slots(req1, 53 - 48, num_computed_tokens, computed_blocks)
    assert [b.block_id for b in blocks] == [5]
    for block in computed_blocks:
        assert block.ref_cnt == 2
    assert manager.block_pool.get_num_free_blocks() == 5

    manager.free(req0)
    manager.free(req1)
    assert manager.block_pool.get_num_free_blocks() == 10
    # [partial tails without hashes, req1's then req0's (5, 4): reused first]
    # [unallocated (6..10)] [common (3, 2, 1)]
    assert free_ids(manager) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    # Cache hit in the common prefix after the original blocks were freed.
    req2 = make_request("2", common_token_ids + [3] * 6)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
    assert [b.block_id for b in computed_blocks] == [1, 2, 3]
    assert num_computed_tokens == 3 * 16
    blocks = manager.allocate_slots(req2, 54 - 48, num_computed_tokens, computed_blocks)
    assert [b.block_id for b in blocks] == [5]
    assert manager.block_pool.get_num_free_blocks() == 6
    assert all(b.ref_cnt == 0 for b in manager.block_pool.free_block_queue.get_all_free_blocks())
    manager.free(req2)

    # Cache miss and eviction: the allocation order is the eviction order.
    req3 = make_request("3", [99] * (16 * 10))
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req3)
    assert not computed_blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req3, 16 * 10, num_computed_tokens, computed_blocks)
    assert [b.block_id for b in blocks] == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert manager.block_pool.get_num_free_blocks() == 0
    queue = manager.block_pool.free_block_queue
    assert queue.fake_head.next_free_block is queue.fake_tail
    assert queue.fake_tail.prev_free_block is queue.fake_head
    # The evicted blocks left the prefix cache.
    assert manager.get_computed_blocks(make_request("4", common_token_ids + [3]))[1] == 0


def test_decode():
    manager = make_manager()
    common_token_ids = [i for i in range(3) for _ in range(16)]
    req0 = make_request("0", common_token_ids + [3] * 7)
    blocks = manager.allocate_slots(req0, 55)
    assert [b.block_id for b in blocks] == [1, 2, 3, 4]

    # Append slots without allocating a new block.
    req0.num_computed_tokens = 55
    for _ in range(4):
        req0.append_output_token_ids(8)
    new_blocks = manager.allocate_slots(req0, 4)
    assert new_blocks == []
    assert manager.req_to_blocks[req0.request_id][-1].block_hash is None

    # 9 tokens fill the previous block and 10 more start the next one.
    req0.num_computed_tokens = 59
    for _ in range(9 + 10):
        req0.append_output_token_ids(7)
    new_blocks = manager.allocate_slots(req0, 19)
    assert new_blocks is not None and len(new_blocks) == 1
    assert manager.req_to_blocks[req0.request_id][-2].block_hash is not None
    assert manager.req_to_blocks[req0.request_id][-1].block_hash is None


def test_evict():
    manager = make_manager()
    last_token_id = 5 * 16 + 7
    req0 = make_request("0", list(range(last_token_id)))
    assert manager.get_computed_blocks(req0) == ([], 0)
    assert len(manager.allocate_slots(req0, 5 * 16 + 7)) == 6  # 5 full + 1 partial

    req1 = make_request("1", list(range(last_token_id, last_token_id + 3 * 16)))
    assert len(manager.allocate_slots(req1, 3 * 16)) == 3
    assert manager.block_pool.get_num_free_blocks() == 1  # 10 - (6 + 3)

    manager.free(req0)
    manager.free(req1)
    assert manager.block_pool.get_num_free_blocks() == 10
    # req0's partial block 6 goes to the head, its hashed blocks and req1's to the tail
    assert free_ids(manager) == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]

    # Touch the first two blocks.
    req2 = make_request("2", list(range(2 * 16 + 3)))
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
    assert [b.block_id for b in computed_blocks] == [1, 2]
    assert num_computed_tokens == 2 * 16
    blocks = manager.allocate_slots(req2, 3, num_computed_tokens, computed_blocks)
    assert [b.block_id for b in blocks] == [6]
    assert manager.block_pool.get_num_free_blocks() == 7


def test_last_token_is_never_a_hit():
    manager = make_manager()
    prompt = list(range(32))  # exactly two blocks
    req0 = make_request("0", prompt)
    manager.allocate_slots(req0, 32)
    req1 = make_request("1", prompt)
    blocks, num_tokens = manager.get_computed_blocks(req1)
    # The second block holds the last token, whose logits are needed: recompute it.
    assert [b.block_id for b in blocks] == [1]
    assert num_tokens == 16


def test_failed_allocation_changes_nothing():
    manager = make_manager(num_blocks=5)  # 4 usable blocks
    req0 = make_request("0", list(range(40)))
    manager.allocate_slots(req0, 40)  # 3 blocks, 2 cached
    manager.free(req0)
    req1 = make_request("1", list(range(40)) + list(range(1000, 1040)))
    hits, num_hits = manager.get_computed_blocks(req1)
    assert num_hits == 32
    # Needs 5 blocks in all: 2 hits (in the free queue) + 3 new, with 4 usable.
    assert manager.allocate_slots(req1, 80 - 32, num_hits, hits) is None
    assert manager.block_pool.get_num_free_blocks() == 4
    assert all(b.ref_cnt == 0 for b in hits)
    assert "1" not in manager.req_to_blocks and "1" not in manager.num_cached_block


def test_caching_disabled():
    manager = make_manager(enable_caching=False)
    req0 = make_request("0", list(range(40)))
    manager.allocate_slots(req0, 40)
    assert all(b.block_hash is None for b in manager.req_to_blocks["0"])
    assert manager.get_computed_blocks(make_request("1", list(range(40)))) == ([], 0)
    manager.record_prefix_cache_lookup(req0, 0)
    assert manager.prefix_cache_stats.queries == 0


def test_prefix_cache_stats_and_usage():
    manager = make_manager()
    req0 = make_request("0", list(range(40)))
    manager.record_prefix_cache_lookup(req0, 0)
    manager.allocate_slots(req0, 40)
    assert manager.usage == 0.3
    req1 = make_request("1", list(range(40)))
    hits, num_hits = manager.get_computed_blocks(req1)
    manager.allocate_slots(req1, 40 - num_hits, num_hits, hits)
    manager.record_prefix_cache_lookup(req1, num_hits)
    stats = manager.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 80, 32)
    assert manager.get_num_common_prefix_blocks("0") == 2
    assert manager.usage == 0.4
    manager.free(req0)
    manager.free(req1)
    assert manager.usage == 0.0
    assert manager.get_block_ids("0") == []


def test_reset_prefix_cache():
    manager = make_manager()
    req0 = make_request("0", list(range(40)))
    manager.allocate_slots(req0, 40)
    assert not manager.reset_prefix_cache()
    manager.free(req0)
    assert manager.reset_prefix_cache()
    assert manager.get_computed_blocks(make_request("1", list(range(40)))) == ([], 0)


def test_a_request_the_runner_refused_leaves_no_cached_blocks() -> None:
    """Its allocation registered its prompt's full blocks before the step ran; the runner
    refused it (no block written), so a later request with the same prompt hits nothing."""
    from cadence.scheduler.request import RequestStatus
    from tests.scheduler.factories import create_requests, create_scheduler, output_for

    scheduler = create_scheduler(block_size=4)
    first, again = create_requests(2, num_tokens=10, same_prompt=True, block_size=4)
    scheduler.add_request(first)
    so = scheduler.schedule()
    out = output_for(so)
    out.failed_requests[first.request_id] = "ValueError: refused"
    out.sampled_token_ids = [[] for _ in out.sampled_token_ids]
    scheduler.update_from_output(so, out)
    assert first.status == RequestStatus.FINISHED_ERROR
    scheduler.add_request(again)
    so = scheduler.schedule()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 0
    assert so.num_scheduled_tokens[again.request_id] == 10


def test_a_request_that_reads_no_cached_block_is_no_lookup() -> None:
    """vLLM: a request with prompt logprobs skips the cache, and its admission counts neither
    as a request nor as queries."""
    manager = make_manager()
    plain = make_request("plain", list(range(40)))
    scoring = Request("scoring", list(range(40)), SamplingParams(max_tokens=1, prompt_logprobs=1),
                      eos_token_id=100, block_hasher=make_block_hasher(BLOCK_SIZE))
    for request in (plain, scoring):
        hits, n = manager.get_computed_blocks(request)
        manager.record_prefix_cache_lookup(request, n)
        manager.allocate_slots(request, 40 - n, n, hits)
    stats = manager.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (1, 40, 0)


def test_skip_reading_prefix_cache_reads_no_cached_block() -> None:
    """vLLM's skip_reading_prefix_cache: a request that asks for it finds no hit where the
    same prompt without it does, and its admission is no lookup; its blocks are still cached
    for others. The default follows prompt_logprobs."""
    assert SamplingParams().skip_reading_prefix_cache is False
    assert SamplingParams(prompt_logprobs=0).skip_reading_prefix_cache is True
    manager = make_manager()
    first = make_request("first", list(range(40)))
    hits, n = manager.get_computed_blocks(first)
    manager.allocate_slots(first, 40 - n, n, hits)
    skipping = Request("skip", list(range(40)),
                       SamplingParams(max_tokens=1, skip_reading_prefix_cache=True),
                       eos_token_id=100, block_hasher=make_block_hasher(BLOCK_SIZE))
    assert manager.get_computed_blocks(skipping) == ([], 0)
    manager.record_prefix_cache_lookup(skipping, 0)
    assert manager.prefix_cache_stats.requests == 0
    reading = make_request("read", list(range(40)))
    assert manager.get_computed_blocks(reading)[1] == 32  # the cache still holds the prompt


def _small(num_blocks: int) -> tuple[KVCacheManager, object]:
    manager = KVCacheManager(num_blocks, 4, True, max_model_len=64)

    def request(request_id: str, prompt: list[int]) -> Request:
        return Request(request_id, prompt, SamplingParams(max_tokens=4), eos_token_id=100,
                       block_hasher=make_block_hasher(4))
    return manager, request


def test_unwritten_blocks_leave_the_cache_from_the_first_one_not_written_whole() -> None:
    """A priority victim or refused request with 6 of its 10 prompt tokens written (blocks of
    4): block 0 (tokens 0-3) holds written KV, block 1 (4-7) only half; a later request with
    the same prompt may hit block 0 alone."""
    manager, request = _small(16)
    a = request("a", list(range(10)))
    manager.allocate_slots(a, 10)
    manager.uncache_unwritten(a, 6)
    hits, num_hits = manager.get_computed_blocks(request("b", list(range(10))))
    assert num_hits == 4 and len(hits) == 1


def test_blocks_another_request_holds_stay_cached_when_one_is_refused() -> None:
    """B hit A's two written blocks; B is refused (none of its own KV written): the blocks A
    wrote and still holds stay in the cache for C."""
    manager, request = _small(16)
    a = request("a", list(range(10)))
    manager.allocate_slots(a, 10)
    b = request("b", list(range(10)))
    hits, num_hits = manager.get_computed_blocks(b)
    assert num_hits == 8
    manager.allocate_slots(b, 2, num_hits, hits)
    manager.uncache_unwritten(b, 0)
    manager.free(b)
    assert manager.get_computed_blocks(request("c", list(range(10))))[1] == 8


def test_hits_a_running_request_holds_take_no_free_block() -> None:
    """Three usable blocks: A holds two (8 tokens); B shares A's first two blocks and needs one
    more, with one free. Hits that a running request holds are not in the free queue, so B's
    allocation fits (counting them as taken from the free queue refused it)."""
    manager, request = _small(4)
    a = request("a", list(range(8)) + [50])
    manager.allocate_slots(a, 8)
    b = request("b", list(range(8)) + [60, 61])
    hits, num_hits = manager.get_computed_blocks(b)
    assert num_hits == 8 and manager.block_pool.get_num_free_blocks() == 1
    assert manager.allocate_slots(b, 2, num_hits, hits) is not None
