"""More of vLLM's tests/v1/core/test_prefix_caching.py, ported with the same inputs and expected
outcomes (one KV cache group: cadence has no hybrid groups, KV events, LoRA or multimodal
hashes). The free-block-queue tests of test_kv_cache_utils.py are in test_block_pool.py.

Free-queue order: as in current vLLM, a freed block with a hash joins the tail of the LRU queue
and one without a hash (prefix caching on) the head, where it is reused first, since it can
never be hit (`BlockPool.free_blocks`; test_kv_cache_manager.py's test_prefill / test_evict
check that order)."""

from __future__ import annotations

from cadence.sampling_params import SamplingParams
from cadence.scheduler.block_hash import hash_block_tokens, make_block_hasher, salted_root
from cadence.scheduler.block_pool import BlockPool, KVCacheBlock
from cadence.scheduler.kv_cache_manager import KVCacheManager
from cadence.scheduler.request import Request


def make_request(
    request_id: str,
    prompt_token_ids: list[int],
    block_size: int = 16,
    prompt_logprobs: int | None = None,
    cache_salt: str | None = None,
) -> Request:
    return Request(
        request_id,
        prompt_token_ids,
        SamplingParams(max_tokens=17, prompt_logprobs=prompt_logprobs),
        eos_token_id=100,
        block_hasher=make_block_hasher(block_size),
        cache_salt=cache_salt,
    )


def make_manager(num_blocks: int, block_size: int = 16, enable_caching: bool = True
                 ) -> KVCacheManager:
    return KVCacheManager(num_blocks, block_size, enable_caching, max_model_len=8192)


def ids(blocks: list[KVCacheBlock] | None) -> list[int]:
    assert blocks is not None
    return [b.block_id for b in blocks]


def free_ids(manager: KVCacheManager) -> list[int]:
    return ids(manager.block_pool.free_block_queue.get_all_free_blocks())


# test_prefix_caching.py --------------------------------------------------------------------
def test_prefill_plp():
    """A prompt-logprobs request gets no prefix hit, though its own full blocks are cached."""
    manager = make_manager(11)
    common_token_ids = [i for i in range(3) for _ in range(16)]

    # Request 0 wants prompt logprobs: a full miss, 3 full blocks and a partial one.
    all_token_ids = common_token_ids + [3] * 7
    req0 = make_request("0", all_token_ids, prompt_logprobs=5)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req0)
    assert len(req0.block_hashes) == 3
    assert not computed_blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req0, 55, num_computed_tokens, computed_blocks)
    assert ids(blocks) == [1, 2, 3, 4]
    assert blocks is not None
    req0_block_hashes = [b.block_hash for b in blocks]
    parent = salted_root(None)
    for block_id in (1, 2, 3):
        parent = hash_block_tokens(parent, all_token_ids[(block_id - 1) * 16 : block_id * 16])
        assert manager.block_pool.blocks[block_id].block_hash == parent
        assert manager.block_pool.blocks[block_id].ref_cnt == 1
    assert manager.block_pool.blocks[4].block_hash is None
    assert manager.block_pool.blocks[4].ref_cnt == 1

    # Request 1 does not want prompt logprobs: it hits the common prefix in use.
    req1 = make_request("1", common_token_ids + [3] * 5)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req1)
    assert len(req1.block_hashes) == 3
    assert ids(computed_blocks) == [1, 2, 3]
    assert num_computed_tokens == 3 * 16
    blocks = manager.allocate_slots(req1, 53 - 48, num_computed_tokens, computed_blocks)
    assert ids(blocks) == [5]
    for block in computed_blocks:
        assert block.ref_cnt == 2
    assert manager.block_pool.get_num_free_blocks() == 5

    manager.free(req0)
    manager.free(req1)
    assert manager.block_pool.get_num_free_blocks() == 10
    # [partial tails without hashes, req1's then req0's (5, 4): reused first]
    # [unallocated (6..10)] [common (3, 2, 1)]
    assert free_ids(manager) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    # Request 2 wants prompt logprobs: no hit; it duplicates request 0's cached blocks.
    req2 = make_request("2", common_token_ids + [3] * 6, prompt_logprobs=5)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
    assert len(req2.block_hashes) == 3
    assert not computed_blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req2, 55, num_computed_tokens, computed_blocks)
    assert blocks is not None
    assert [b.block_hash for b in blocks] == req0_block_hashes
    assert ids(blocks) != [1, 2, 3, 4]
    for block in blocks:
        assert block.ref_cnt == 1
    manager.free(req2)


def test_hash_block_correct_reuse():
    """A cached block taken for new content loses its hash."""
    block_size = 16
    manager = make_manager(2)
    req = make_request("0", list(range(block_size)))
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req)
    assert not computed_blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req, block_size, num_computed_tokens, computed_blocks)
    assert blocks is not None and len(blocks) == 1
    manager.free(req)

    # A block that is not full: any hash left on the reused block must be gone.
    req = make_request("1", list(range(block_size - 1)))
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req)
    assert not computed_blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req, block_size - 1, num_computed_tokens, computed_blocks)
    assert blocks is not None and len(blocks) == 1
    assert manager.block_pool.blocks[blocks[0].block_id].block_hash is None


def test_computed_blocks_not_evicted():
    """New blocks for a request never evict its own prefix hits while other blocks are free."""
    block_size = 16
    manager = make_manager(3)
    req0 = make_request("0", list(range(block_size)))
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req0)
    assert not computed_blocks and num_computed_tokens == 0
    assert ids(manager.allocate_slots(req0, block_size)) == [1]

    req1 = make_request("1", list(range(block_size, block_size * 2)))
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req1)
    assert not computed_blocks and num_computed_tokens == 0
    assert ids(manager.allocate_slots(req1, block_size)) == [2]

    manager.free(req0)
    manager.free(req1)

    # A hit on the first block: the second cached block is evicted, not the first.
    req2 = make_request("2", list(range(block_size * 2)))
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
    assert ids(computed_blocks) == [1]
    assert num_computed_tokens == block_size
    blocks = manager.allocate_slots(req2, block_size, num_computed_tokens, computed_blocks)
    assert ids(blocks) == [2]


def test_basic_prefix_caching_disabled():
    block_size = 4
    manager = make_manager(5, block_size=block_size, enable_caching=False)

    req1 = make_request("1", list(range(10)), block_size)  # 2 blocks and some more
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req1)
    assert not computed_blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req1, 10, num_computed_tokens, computed_blocks)
    assert blocks is not None and len(blocks) == 3
    manager.free(req1)

    # No caching: a shared prefix is not a hit.
    req2 = make_request("2", list(range(16)), block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
    assert not computed_blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req2, 16, num_computed_tokens, computed_blocks)
    assert blocks is not None and len(blocks) == 4

    # Every usable block is taken: a new request gets none.
    req3 = make_request("3", list(range(4)), block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req3)
    assert not computed_blocks and num_computed_tokens == 0
    assert not manager.allocate_slots(req3, 4, num_computed_tokens, computed_blocks)


def test_cache_blocks():
    """BlockPool.cache_full_blocks registers exactly the blocks in [num_cached, num_full)."""
    block_size = 4
    pool = BlockPool(num_blocks=5, enable_caching=True)
    # Blocks: [0, 1, 2, 3] [4, 5, 6, 7] [8, 9, 10, 11] [12, 13]
    req = make_request("0", list(range(14)), block_size)

    blocks = [KVCacheBlock(block_id=i) for i in range(2)]
    pool.cache_full_blocks(blocks, req.block_hashes, num_cached_blocks=0, num_full_blocks=2)
    assert len(pool.cached_block_hash_to_block) == 2
    assert all(block.block_hash is not None for block in blocks)

    # Blocks that do not start at the beginning.
    blocks += [KVCacheBlock(block_id=2)]
    pool.cache_full_blocks(blocks, req.block_hashes, num_cached_blocks=2, num_full_blocks=3)
    assert len(pool.cached_block_hash_to_block) == 3
    assert blocks[0].block_hash is not None


def test_cache_key_salting():
    """A cache salt enters the first block's hash only, and separates the cache."""
    block_size = 16
    manager = make_manager(11)
    common_token_ids = [i for i in range(3) for _ in range(block_size)]
    token_ids = common_token_ids + [3] * 11
    req0 = make_request("0", token_ids, cache_salt="salt1")
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req0)
    assert not computed_blocks and num_computed_tokens == 0
    block_hashes = req0.block_hashes
    assert len(block_hashes) == 3
    assert block_hashes[0] == hash_block_tokens(salted_root("salt1"), token_ids[:block_size])
    assert block_hashes[1] == hash_block_tokens(block_hashes[0], token_ids[16:32])
    assert block_hashes[2] == hash_block_tokens(block_hashes[1], token_ids[32:48])

    blocks = manager.allocate_slots(req0, 59, num_computed_tokens, computed_blocks)
    assert ids(blocks) == [1, 2, 3, 4]
    req0.num_computed_tokens = 59

    # Appending slots without a new block; the fourth block's hash follows the output.
    for _ in range(5):
        req0.append_output_token_ids(8)
    assert manager.allocate_slots(req0, 5) == []
    assert len(block_hashes) == 4
    assert block_hashes[3] == hash_block_tokens(block_hashes[2], token_ids[48:] + [8] * 5)

    # The same salt: a hit on the 3-block prefix.
    req1 = make_request("1", common_token_ids + [4] * 11, cache_salt="salt1")
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req1)
    assert len(computed_blocks) == 3
    assert num_computed_tokens == 3 * block_size

    # The same content with another salt: a miss.
    token_ids = common_token_ids + [4] * 11
    req2 = make_request("2", token_ids, cache_salt="salt2")
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
    assert len(computed_blocks) == 0 and num_computed_tokens == 0
    block_hashes = req2.block_hashes
    assert len(block_hashes) == 3
    assert block_hashes[0] == hash_block_tokens(salted_root("salt2"), token_ids[:block_size])
    assert block_hashes[1] == hash_block_tokens(block_hashes[0], token_ids[16:32])
    assert block_hashes[2] == hash_block_tokens(block_hashes[1], token_ids[32:48])


def test_prefill_not_enough_free_blocks_with_computed_blocks():
    """A request with prefix hits that cannot get its new blocks leaves the hits untouched."""
    manager = make_manager(11)
    # | Common-0 | Common-1 | Common-2 |
    common_token_ids = [i for i in range(3) for _ in range(16)]
    req0 = make_request("0", common_token_ids)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req0)
    assert not computed_blocks and num_computed_tokens == 0
    manager.allocate_slots(req0, 48, num_computed_tokens, computed_blocks)
    block_part0 = manager.req_to_blocks[req0.request_id]

    # | Common-0 | Common-1 | Common-2 | Req1-3 | Req1-4 | Req1-5 |
    req1 = make_request("1", common_token_ids * 2)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req1)
    assert computed_blocks == block_part0
    assert num_computed_tokens == 3 * 16
    manager.allocate_slots(req1, 48, num_computed_tokens, computed_blocks)
    block_part1 = manager.req_to_blocks[req1.request_id]
    # Req1-3, Req1-4 and Req1-5 become free (and stay cached).
    manager.free(req1)
    assert {block.ref_cnt for block in block_part1[:3]} == {1}
    assert {block.ref_cnt for block in block_part1[3:]} == {0}

    # | ... | Req2-0 | Req2-1 |
    req2 = make_request("2", [7] * 16 * 2)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
    assert not computed_blocks and num_computed_tokens == 0
    manager.allocate_slots(req2, 16 * 2, num_computed_tokens, computed_blocks)

    # Req3 is Req1 plus 3 more blocks: 6 blocks are hits, but only 5 blocks are free for the 3
    # new ones and the 3 free hits, so it cannot be allocated and no ref_cnt changes.
    assert manager.block_pool.get_num_free_blocks() == 5
    req3 = make_request("3", common_token_ids * 3)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req3)
    assert computed_blocks == block_part1
    assert num_computed_tokens == 6 * 16
    assert manager.allocate_slots(req3, 48, num_computed_tokens, computed_blocks) is None
    assert {block.ref_cnt for block in block_part1[:3]} == {1}
    assert {block.ref_cnt for block in block_part1[3:]} == {0}


def test_maybe_evict_cached_block():
    """Evicting one block of a hash that several blocks carry keeps the others' entry.
    (vLLM tags its hashes with a group id and uses pool.blocks including the null block;
    cadence has one group and never caches the null block, so blocks 1..4 play the part.)"""
    pool = BlockPool(num_blocks=5, enable_caching=True)
    hash0, hash1, hash2 = b"10" * 16, b"20" * 16, b"30" * 16
    blocks = pool.get_new_blocks(4)
    # block3 has exactly the same hash as block0.
    pool.cache_full_blocks(blocks, [hash0, hash1, hash2, hash0], 0, 4)
    block0, block1, block2, block3 = blocks
    table = pool.cached_block_hash_to_block
    assert table == {
        hash0: {block0.block_id: block0, block3.block_id: block3},
        hash1: {block1.block_id: block1},
        hash2: {block2.block_id: block2},
    }
    pool._evict_cached_block(block1)
    assert table == {
        hash0: {block0.block_id: block0, block3.block_id: block3},
        hash2: {block2.block_id: block2},
    }
    # hash0's entry stays: block3 carries the same hash.
    pool._evict_cached_block(block0)
    assert table == {hash0: {block3.block_id: block3}, hash2: {block2.block_id: block2}}
    pool._evict_cached_block(block2)
    assert table == {hash0: {block3.block_id: block3}}
    pool._evict_cached_block(block3)
    assert table == {}
