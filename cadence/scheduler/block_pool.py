"""Physical KV-cache blocks, the LRU free-block queue and the block pool (vLLM v1 ``BlockPool``).

Block 0 is the null block: it is never handed out, and the GPU path pads CUDA-graph rows into it.
A block whose ``ref_cnt`` drops to 0 goes to the tail of the free queue but keeps its hash, so a
later request with the same prefix can take it back (``touch``) until it is evicted: eviction
takes blocks from the head, i.e. least recently freed first. With prefix caching on, a freed
block without a hash (a partial last block: no request can ever hit it) goes to the head
instead, to be reused first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class KVCacheBlock:
    """One block of ``block_size`` KV slots. Identity (not value) equality: blocks live in sets."""

    block_id: int
    ref_cnt: int = 0
    # Hash of the block's tokens chained with its parent's hash; set only while the block is full
    # and registered in the prefix cache.
    block_hash: bytes | None = None
    is_null: bool = False
    prev_free_block: KVCacheBlock | None = field(default=None, repr=False)
    next_free_block: KVCacheBlock | None = field(default=None, repr=False)


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks, in eviction order (head first).

    The links live in the blocks themselves, so removing a block from the middle (a prefix-cache
    hit on a freed block) is O(1). Two sentinel nodes remove every boundary case.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = 0
        self.fake_head = KVCacheBlock(block_id=-1)
        self.fake_tail = KVCacheBlock(block_id=-1)
        self.fake_head.next_free_block = self.fake_tail
        self.fake_tail.prev_free_block = self.fake_head
        self.append_n(blocks)

    def popleft(self) -> KVCacheBlock:
        block = self.fake_head.next_free_block
        if block is self.fake_tail or block is None:
            raise ValueError("No free blocks available")
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot pop {n} blocks: only {self.num_free_blocks} are free.")
        out: list[KVCacheBlock] = []
        block = self.fake_head.next_free_block
        for _ in range(n):
            assert block is not None
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = None
            block.next_free_block = None
            block = nxt
        assert block is not None
        self.fake_head.next_free_block = block
        block.prev_free_block = self.fake_head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise RuntimeError(f"Block {block.block_id} is not in the free queue.")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = None
        block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self.fake_tail.prev_free_block
        assert last is not None
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self.fake_tail
        self.fake_tail.prev_free_block = block
        self.num_free_blocks += 1

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put ``blocks`` at the head, in their order (``blocks[0]`` is taken first)."""
        if not blocks:
            return
        first = self.fake_head.next_free_block
        assert first is not None
        prev = self.fake_head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = first
        first.prev_free_block = prev
        self.num_free_blocks += len(blocks)

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        if not blocks:
            return
        last = self.fake_tail.prev_free_block
        assert last is not None
        for block in blocks:
            last.next_free_block = block
            block.prev_free_block = last
            last = block
        last.next_free_block = self.fake_tail
        self.fake_tail.prev_free_block = last
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        out: list[KVCacheBlock] = []
        block = self.fake_head.next_free_block
        while block is not None and block is not self.fake_tail:
            out.append(block)
            block = block.next_free_block
        return out


class BlockPool:
    """All KV blocks of the engine: allocation, reference counts and the prefix-cache map."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"num_blocks must be at least 2 (block 0 is reserved), got {num_blocks}."
            )
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(block_id=i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        # hash -> {block_id: block}. Several blocks can carry one hash (identical content computed
        # by different requests): block tables are append-only, so duplicates are not merged.
        self.cached_block_hash_to_block: dict[bytes, dict[int, KVCacheBlock]] = {}
        # Its ref_cnt is never maintained and it never returns to the free queue.
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of usable blocks (the null block excluded) that are held by requests."""
        total = self.num_blocks - 1
        return (total - self.free_block_queue.num_free_blocks) / total

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        cached = self.cached_block_hash_to_block.get(block_hash)
        if not cached:
            return None
        return next(iter(cached.values()))

    def cache_full_blocks(
        self,
        blocks: list[KVCacheBlock],
        block_hashes: list[bytes],
        num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Register ``blocks[num_cached_blocks:num_full_blocks]`` under their hashes."""
        if num_full_blocks > len(block_hashes):
            raise ValueError(
                f"Cannot cache {num_full_blocks} blocks with {len(block_hashes)} block hashes."
            )
        table = self.cached_block_hash_to_block
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null:
                continue
            assert block.block_hash is None, f"block {block.block_id} is already cached"
            block_hash = block_hashes[i]
            block.block_hash = block_hash
            entry = table.get(block_hash)
            if entry is None:
                table[block_hash] = {block.block_id: block}
            else:
                entry[block.block_id] = block

    def get_new_blocks(self, num_blocks: int, evict: bool = True) -> list[KVCacheBlock]:
        """Take ``num_blocks`` blocks from the head of the free queue, evicting cached ones.
        ``evict=False`` leaves that to a later ``evict_blocks(blocks)``; until then the
        blocks' old hashes still find them, so no lookup may run in between."""
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool.")
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            assert block.ref_cnt == 0
            block.ref_cnt = 1
        if evict:
            self.evict_blocks(blocks)
        return blocks

    def evict_blocks(self, blocks: list[KVCacheBlock]) -> None:
        """Drop the prefix-cache entries of blocks just taken from the free queue (by
        ``get_new_blocks``, or later for ``get_new_blocks(evict=False)``)."""
        for block in blocks:
            if block.block_hash is not None:
                self._evict_cached_block(block)

    def _evict_cached_block(self, block: KVCacheBlock) -> None:
        block_hash = block.block_hash
        assert block_hash is not None
        entry = self.cached_block_hash_to_block.get(block_hash)
        if entry is not None:
            entry.pop(block.block_id, None)
            if not entry:
                del self.cached_block_hash_to_block[block_hash]
        block.block_hash = None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits; a hit on a free block pulls it off the queue."""
        queue = self.free_block_queue
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference per block; blocks reaching 0 join the free queue in the given order
        (the first one given is evicted first): at the tail, or with prefix caching on and no
        hash, at the head (they can never be hit, so they go before any cached block)."""
        cached: list[KVCacheBlock] = []
        fresh: list[KVCacheBlock] = []
        for block in ordered_blocks:
            if block.is_null:
                continue
            if block.ref_cnt <= 0:
                raise RuntimeError(f"Block {block.block_id} freed more often than referenced.")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                (fresh if block.block_hash is None and self.enable_caching else cached).append(block)
        self.free_block_queue.prepend_n(fresh)
        self.free_block_queue.append_n(cached)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Only possible when no request holds a block."""
        if self.num_blocks - self.free_block_queue.num_free_blocks != 1:
            return False
        self.cached_block_hash_to_block.clear()
        for block in self.blocks:
            block.block_hash = None
        return True
