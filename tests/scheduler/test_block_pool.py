"""Free-block queue and block pool: LRU order, reference counts, eviction, the null block."""

from __future__ import annotations

import pytest

from cadence.scheduler.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock


def _ids(blocks: list[KVCacheBlock]) -> list[int]:
    return [b.block_id for b in blocks]


def test_free_queue_remove_from_middle_and_append():
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.num_free_blocks == 5
    queue.remove(blocks[2])
    assert _ids(queue.get_all_free_blocks()) == [0, 1, 3, 4]
    assert blocks[2].prev_free_block is None and blocks[2].next_free_block is None
    queue.append(blocks[2])
    assert _ids(queue.get_all_free_blocks()) == [0, 1, 3, 4, 2]
    assert queue.popleft() is blocks[0]
    assert _ids(queue.popleft_n(2)) == [1, 3]
    assert _ids(queue.get_all_free_blocks()) == [4, 2]
    queue.append_n([blocks[0], blocks[1]])
    assert _ids(queue.get_all_free_blocks()) == [4, 2, 0, 1]
    assert queue.num_free_blocks == 4
    with pytest.raises(RuntimeError):
        queue.remove(blocks[3])  # not in the queue
    with pytest.raises(ValueError):
        queue.popleft_n(5)


def test_null_block_is_reserved():
    pool = BlockPool(num_blocks=4, enable_caching=True)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.get_num_free_blocks() == 3
    blocks = pool.get_new_blocks(3)
    assert 0 not in _ids(blocks)
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    pool.free_blocks([pool.null_block])  # never enters the free queue
    assert pool.get_num_free_blocks() == 0
    with pytest.raises(ValueError):
        BlockPool(num_blocks=1, enable_caching=True)


def test_ref_counts_touch_and_free():
    pool = BlockPool(num_blocks=6, enable_caching=True)
    a, b = pool.get_new_blocks(2)
    assert (a.ref_cnt, b.ref_cnt) == (1, 1)
    pool.touch([a])
    assert a.ref_cnt == 2
    pool.free_blocks([a, b])
    assert (a.ref_cnt, b.ref_cnt) == (1, 0)
    assert _ids(pool.free_block_queue.get_all_free_blocks()) == [3, 4, 5, 2]
    # Touching a free block takes it off the queue.
    pool.touch([b])
    assert b.ref_cnt == 1
    assert _ids(pool.free_block_queue.get_all_free_blocks()) == [3, 4, 5]
    pool.free_blocks([a, b])
    with pytest.raises(RuntimeError):
        pool.free_blocks([a])  # double free
    assert pool.get_usage() == 0.0


def test_eviction_follows_free_order_and_drops_hash():
    pool = BlockPool(num_blocks=5, enable_caching=True)
    blocks = pool.get_new_blocks(4)
    hashes = [bytes([i]) * 32 for i in range(4)]
    pool.cache_full_blocks(blocks, hashes, num_cached_blocks=0, num_full_blocks=3)
    assert [b.block_hash for b in blocks] == hashes[:3] + [None]
    assert pool.get_cached_block(hashes[1]) is blocks[1]
    # Freed in reverse: the tail of the sequence is evicted first.
    pool.free_blocks(reversed(blocks))
    assert _ids(pool.free_block_queue.get_all_free_blocks()) == [4, 3, 2, 1]
    # A cached block stays reusable while free...
    assert pool.get_cached_block(hashes[0]) is blocks[0]
    # ...until it is taken for new content: eviction clears the hash and the map entry.
    taken = pool.get_new_blocks(2)
    assert _ids(taken) == [4, 3]
    assert blocks[2].block_hash is None
    assert pool.get_cached_block(hashes[2]) is None
    assert pool.get_cached_block(hashes[1]) is blocks[1]
    assert all(b.ref_cnt == 1 for b in taken)


def test_duplicate_hashes_are_kept_per_block():
    pool = BlockPool(num_blocks=4, enable_caching=True)
    a, b = pool.get_new_blocks(2)
    h = b"h" * 32
    pool.cache_full_blocks([a], [h], 0, 1)
    pool.cache_full_blocks([b], [h], 0, 1)
    assert pool.get_cached_block(h) is a
    pool.free_blocks([a])
    pool.get_new_blocks(2)  # evicts a (and the unused block 3)
    assert pool.get_cached_block(h) is b


def test_reset_prefix_cache_only_when_nothing_is_held():
    pool = BlockPool(num_blocks=4, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [b"x" * 32, b"y" * 32], 0, 2)
    assert not pool.reset_prefix_cache()
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache()
    assert pool.get_cached_block(b"x" * 32) is None
    assert all(b.block_hash is None for b in pool.blocks)
