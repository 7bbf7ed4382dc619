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
    assert _ids(pool.free_block_queue.get_all_free_blocks()) == [2, 3, 4, 5]  # no hash: head
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


@pytest.mark.parametrize("caching", [True, False])
def test_freed_blocks_without_a_hash_are_reused_first_when_caching(caching: bool):
    """vLLM's ``free_blocks``: with prefix caching on, freed blocks without a hash go to the
    head in the order given and hashed ones to the tail; with it off, all go to the tail."""
    pool = BlockPool(num_blocks=8, enable_caching=caching)
    blocks = pool.get_new_blocks(5)  # ids 1..5, free queue [6, 7]
    if caching:
        pool.cache_full_blocks(blocks[:2], [b"a" * 32, b"b" * 32], 0, 2)
    pool.free_blocks(reversed(blocks))  # 5, 4, 3, then the hashed 2, 1
    expected = [5, 4, 3, 6, 7, 2, 1] if caching else [6, 7, 5, 4, 3, 2, 1]
    assert _ids(pool.free_block_queue.get_all_free_blocks()) == expected
    assert pool.get_num_free_blocks() == 7
    assert _ids(pool.get_new_blocks(7)) == expected


def test_free_kv_cache_block_queue_prepend_n():
    blocks = [KVCacheBlock(block_id=i) for i in range(6)]
    queue = FreeKVCacheBlockQueue(blocks[:2])
    queue.prepend_n([])
    assert queue.num_free_blocks == 2
    queue.prepend_n(blocks[2:5])
    assert _ids(queue.get_all_free_blocks()) == [2, 3, 4, 0, 1]
    assert queue.num_free_blocks == 5
    assert queue.fake_head.next_free_block is blocks[2]
    assert blocks[4].next_free_block is blocks[0] and blocks[0].prev_free_block is blocks[4]
    queue.remove(blocks[3])
    queue.prepend_n([blocks[5]])
    assert _ids(queue.popleft_n(5)) == [5, 2, 4, 0, 1]
    assert queue.fake_head.next_free_block is queue.fake_tail


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


def test_reset_prefix_cache_refused_while_a_single_block_is_held():
    pool = BlockPool(num_blocks=4, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [b"x" * 32, b"y" * 32], 0, 2)
    pool.free_blocks(blocks[1:])  # block 0 of the two is still held
    assert not pool.reset_prefix_cache()
    assert pool.get_cached_block(b"x" * 32) is blocks[0]
    assert pool.get_cached_block(b"y" * 32) is blocks[1]


# Ported from vLLM's tests/v1/core/test_kv_cache_utils.py (same inputs, same outcomes) -------
def test_free_kv_cache_block_queue_initialization():
    block = KVCacheBlock(block_id=0)
    queue = FreeKVCacheBlockQueue([block])
    assert queue.num_free_blocks == 1
    assert queue.fake_head.next_free_block is block
    assert queue.fake_tail.prev_free_block is block


def test_free_kv_cache_block_queue_operations():
    blocks = [KVCacheBlock(block_id=i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.num_free_blocks == 5
    assert queue.fake_head.next_free_block is blocks[0]
    assert queue.fake_tail.prev_free_block is blocks[4]

    assert queue.popleft() is blocks[0]
    assert queue.num_free_blocks == 4
    assert queue.fake_head.next_free_block is blocks[1]
    assert queue.fake_tail.prev_free_block is blocks[4]

    # Remove from the middle.
    block_to_remove = blocks[2]
    queue.remove(block_to_remove)
    assert queue.num_free_blocks == 3
    assert blocks[1].next_free_block is blocks[3]
    assert blocks[3].prev_free_block is blocks[1]

    # Append it back.
    queue.append(block_to_remove)
    assert queue.num_free_blocks == 4
    assert queue.fake_tail.prev_free_block is block_to_remove
    assert block_to_remove.prev_free_block is blocks[4]
    assert block_to_remove.next_free_block is queue.fake_tail

    for _ in range(4):
        queue.popleft()
    assert queue.num_free_blocks == 0
    assert queue.fake_head.next_free_block is queue.fake_tail
    assert queue.fake_tail.prev_free_block is queue.fake_head

    with pytest.raises(ValueError) as e:
        queue.popleft()
    assert str(e.value) == "No free blocks available"


def _assert_chain(queue: FreeKVCacheBlockQueue, chain: list[KVCacheBlock]) -> None:
    """fake_head -> chain... -> fake_tail, with every link in both directions."""
    nodes = [queue.fake_head, *chain, queue.fake_tail]
    for prev, nxt in zip(nodes, nodes[1:]):
        assert prev.next_free_block is nxt
        assert nxt.prev_free_block is prev


def test_free_kv_cache_block_queue_append_n():
    queue = FreeKVCacheBlockQueue([])
    blocks = [KVCacheBlock(block_id=i) for i in range(6)]
    queue.append_n([])
    assert queue.num_free_blocks == 0
    _assert_chain(queue, [])
    queue.append_n(blocks[0:1])
    assert queue.num_free_blocks == 1
    _assert_chain(queue, [blocks[0]])
    queue.append_n(blocks[4:6])
    assert queue.num_free_blocks == 3
    _assert_chain(queue, [blocks[0], blocks[4], blocks[5]])
    queue.append_n(blocks[1:4])
    assert queue.num_free_blocks == 6
    _assert_chain(queue, [blocks[0], blocks[4], blocks[5], blocks[1], blocks[2], blocks[3]])

    # A broken tail link trips append_n's assertion and changes nothing.
    invalid_queue = FreeKVCacheBlockQueue([])
    invalid_queue.fake_tail.prev_free_block = None
    with pytest.raises(AssertionError):
        invalid_queue.append_n(blocks[0:1])
    assert invalid_queue.num_free_blocks == 0
    assert invalid_queue.fake_head.next_free_block is invalid_queue.fake_tail


def test_free_kv_cache_block_queue_popleft_n():
    blocks = [KVCacheBlock(block_id=i) for i in range(6)]
    order = [blocks[1], blocks[3], blocks[5], blocks[4], blocks[0], blocks[2]]
    queue = FreeKVCacheBlockQueue(order)
    assert queue.num_free_blocks == 6
    _assert_chain(queue, order)

    assert len(queue.popleft_n(0)) == 0
    assert queue.num_free_blocks == 6
    expected_pops = [[blocks[1]], [blocks[3], blocks[5]], [blocks[4], blocks[0], blocks[2]]]
    remaining = 6
    for expected in expected_pops:
        result = queue.popleft_n(len(expected))
        remaining -= len(expected)
        assert queue.num_free_blocks == remaining
        assert len(result) == len(expected)
        assert all(got is want for got, want in zip(result, expected))
        for block in result:
            assert block.prev_free_block is None and block.next_free_block is None
    _assert_chain(queue, [])


def test_free_kv_cache_block_queue_get_all_free_blocks():
    blocks = [KVCacheBlock(block_id=i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.get_all_free_blocks() == blocks
    queue.popleft()
    assert queue.get_all_free_blocks() == blocks[1:]
    block_to_remove = blocks[2]
    queue.remove(block_to_remove)
    assert queue.get_all_free_blocks() == blocks[1:2] + blocks[3:]
    queue.append(block_to_remove)
    assert queue.get_all_free_blocks() == blocks[1:2] + blocks[3:] + [block_to_remove]


def test_touch_passes_over_the_null_block():
    """A hit list may hold the null block (sliding-window tables pad with it): touching it
    takes nothing off the free queue."""
    pool = BlockPool(num_blocks=4, enable_caching=True)
    (block,) = pool.get_new_blocks(1)
    pool.free_blocks([block])
    free = pool.get_num_free_blocks()
    pool.touch([pool.null_block, block])
    assert block.ref_cnt == 1
    assert pool.get_num_free_blocks() == free - 1


def test_the_null_block_is_never_registered_under_a_hash():
    """A block table padded with the null block (a sliding window's dropped blocks) caches
    its real blocks only: no later prompt may hit the null block."""
    pool = BlockPool(num_blocks=4, enable_caching=True)
    (block,) = pool.get_new_blocks(1)
    pool.cache_full_blocks([pool.null_block, block], [b"n" * 32, b"b" * 32], 0, 2)
    assert pool.get_cached_block(b"n" * 32) is None
    assert pool.null_block.block_hash is None
    assert pool.get_cached_block(b"b" * 32) is block
