"""Per-request KV block tables over the block pool, with prefix caching (vLLM v1
``KVCacheManager`` for one full-attention group).

With ``defer_caching`` the full blocks an allocation makes cacheable are registered in the
prefix cache (and hashed) by ``flush_deferred``, which the engine calls once a step has
launched, so that a prompt's hashing overlaps its forward pass instead of delaying it; so is
the eviction of the old hashes of the blocks an allocation takes (a dictionary update per
block: ~0.5 us each before a long prompt's first kernel). Registrations and evictions are
replayed in the order they were asked for (blocks of equal hash are found in registration
order), and every lookup, free and reset flushes them all first, so what any request hits is
what it would hit with immediate registration.
"""

from __future__ import annotations

from dataclasses import dataclass

from cadence.scheduler.block_hash import hash_block_tokens, make_block_hasher
from cadence.scheduler.block_pool import BlockPool, KVCacheBlock
from cadence.scheduler.request import Request

__all__ = [
    "KVCacheManager",
    "PrefixCacheStats",
    "hash_block_tokens",
    "make_block_hasher",
]

_NO_BLOCKS: list[KVCacheBlock] = []


@dataclass
class PrefixCacheStats:
    """Cumulative prefix-cache lookups of admitted requests, counted in tokens. A preempted
    request's lookups on readmission are counted apart (vLLM's ``preempted_*``), so a victim
    finding its own blocks again does not raise the hit rate."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool,
        max_model_len: int,
        defer_caching: bool = False,
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # How many leading blocks of each request are registered in the prefix cache.
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()
        self.defer_caching = defer_caching
        # In call order, waiting for flush_deferred: (request, tokens known) per cache_blocks
        # call (a registration), (None, blocks) per allocation (an eviction of old hashes).
        self._deferred: list[tuple[Request | None, int | list[KVCacheBlock]]] = []

    @property
    def usage(self) -> float:
        """Fraction of the usable KV blocks held by requests, 0..1."""
        return self.block_pool.get_usage()

    @property
    def num_usable_blocks(self) -> int:
        return self.block_pool.num_blocks - 1

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest run of cached full blocks matching the request's prefix, and its token count.

        The last token is never a hit (its logits are needed), so a fully cached prompt still
        recomputes its last block. A request that wants prompt logprobs reads no cached block: every
        prompt position must be computed (vLLM does the same); nor does one that asks to skip
        the lookup (``skip_reading_prefix_cache``).
        """
        if not self.enable_caching or not request.sampling_params.reads_prefix_cache:
            return [], 0
        if self._deferred:
            self.flush_deferred()
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        pool = self.block_pool
        hits: list[KVCacheBlock] = []
        # Hashed as far as the lookup goes (doubling), not the whole prompt: a miss on the
        # first block costs one hash.
        hashes = request.hash_blocks(min(1, max_hit_blocks))
        for i in range(max_hit_blocks):
            if i == len(hashes):
                request.hash_blocks(min(2 * i, max_hit_blocks))  # extends ``hashes``
                if i == len(hashes):
                    break  # a request without a hasher has no hashes
            block = pool.get_cached_block(hashes[i])
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_cache_lookup(self, request: Request, num_hit_tokens: int) -> None:
        """Count one admitted request's lookup (the scheduler calls this once per admission);
        a request that reads no cached block (prompt logprobs) made none (vLLM)."""
        if not self.enable_caching or not request.sampling_params.reads_prefix_cache:
            return
        stats = self.prefix_cache_stats
        if request.num_preemptions > 0:
            stats.preempted_requests += 1
            stats.preempted_queries += request.num_tokens
            stats.preempted_hits += num_hit_tokens
            return
        stats.requests += 1
        stats.queries += request.num_tokens
        stats.hits += num_hit_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[KVCacheBlock] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[KVCacheBlock] | None:
        """Make room for ``num_new_tokens`` more tokens after the computed ones.

        ``new_computed_blocks`` are prefix-cache hits (``num_new_computed_tokens`` tokens) taken
        on this call. Returns the newly allocated blocks (possibly empty), or None when the pool
        cannot supply them; in that case nothing changes.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens}.")
        req_id = request.request_id
        req_blocks = self.req_to_blocks.get(req_id)
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        num_slots = num_computed + num_new_tokens + num_lookahead_tokens
        if num_slots > self.max_model_len:
            num_slots = self.max_model_len
        num_required = -(-num_slots // self.block_size)
        pool = self.block_pool

        if new_computed_blocks:
            hits = new_computed_blocks
            # Hits sitting in the free queue count: touching them takes them out of it.
            num_evictable_hits = 0
            for block in hits:
                if block.ref_cnt == 0:
                    num_evictable_hits += 1
        else:
            hits = _NO_BLOCKS
            num_evictable_hits = 0
        num_new_blocks = num_required - len(hits) - (len(req_blocks) if req_blocks else 0)
        if num_new_blocks + num_evictable_hits > pool.free_block_queue.num_free_blocks:
            return None

        if req_blocks is None:
            req_blocks = self.req_to_blocks[req_id] = []
        if hits:
            pool.touch(hits)
            req_blocks.extend(hits)
            # Hits are registered in the cache already; caching resumes after them.
            self.num_cached_block[req_id] = len(req_blocks)
        if num_new_blocks > 0:
            defer = self.defer_caching and self.enable_caching  # no hashes, nothing to evict
            new_blocks = pool.get_new_blocks(num_new_blocks, evict=not defer)
            if defer:
                # Its own list: the caller's may change before the flush replays it.
                self._deferred.append((None, list(new_blocks)))
            req_blocks.extend(new_blocks)
        else:
            new_blocks = []

        if self.enable_caching:
            # Only tokens whose ids are known can be hashed: never past request.num_tokens.
            num_known = num_computed + num_new_tokens
            num_tokens = request.num_tokens
            if num_known > num_tokens:
                num_known = num_tokens
            if num_known // self.block_size > self.num_cached_block.get(req_id, 0):
                self.cache_blocks(request, num_known)
        return new_blocks

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's blocks that are full within its first ``num_computed_tokens``
        (at the next ``flush_deferred`` with ``defer_caching``)."""
        if not self.enable_caching:
            return
        if self.defer_caching:
            self._deferred.append((request, num_computed_tokens))
            return
        self._cache_now(request, num_computed_tokens)

    def flush_deferred(self) -> None:
        """Register every deferred block now, in the order the registrations were asked for
        (as immediate registration would have: a lookup takes the first block of a hash)."""
        deferred = self._deferred
        if not deferred:
            return
        self._deferred = []
        for request, tokens_or_blocks in deferred:
            if request is None:
                self.block_pool.evict_blocks(tokens_or_blocks)
            else:
                self._cache_now(request, tokens_or_blocks)

    def _cache_now(self, request: Request, num_computed_tokens: int) -> None:
        req_id = request.request_id
        num_full = num_computed_tokens // self.block_size
        num_cached = self.num_cached_block.get(req_id, 0)
        if num_full <= num_cached:
            return
        blocks = self.req_to_blocks.get(req_id)
        if blocks is None:
            return
        if num_full > len(blocks):
            num_full = len(blocks)
        self.block_pool.cache_full_blocks(blocks, request.hash_blocks(num_full), num_cached,
                                          num_full)
        self.num_cached_block[req_id] = num_full

    def uncache_unwritten(self, request: Request, num_written_tokens: int) -> None:
        """Take out of the prefix cache the request's registered blocks past its first
        ``num_written_tokens`` that it alone holds: an allocation registers blocks before the
        step that fills them runs, so a request taken back out of that step (a priority victim
        scheduled earlier in the same schedule) or refused by the runner must not leave them
        to be hit. A block another request holds too stays (it was a hit, written before)."""
        if not self.enable_caching:
            return
        if self._deferred:  # the registrations asked for so far happen first, in order
            self.flush_deferred()
        req_id = request.request_id
        blocks = self.req_to_blocks.get(req_id)
        num_cached = self.num_cached_block.get(req_id, 0)
        first = num_written_tokens // self.block_size
        if not blocks or num_cached <= first:
            return
        self.block_pool.evict_blocks([b for b in blocks[first:num_cached] if b.ref_cnt == 1])
        self.num_cached_block[req_id] = first

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first, so its last blocks are evicted first."""
        req_id = request.request_id
        if self._deferred:  # everything registered before these blocks go back, in order
            self.flush_deferred()
        blocks = self.req_to_blocks.pop(req_id, None)
        self.num_cached_block.pop(req_id, None)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        return self.req_to_blocks.get(request_id) or []

    def get_block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_to_blocks.get(request_id, _NO_BLOCKS)]

    def get_num_common_prefix_blocks(self, request_id: str) -> int:
        """Leading blocks of ``request_id`` shared by every request that holds blocks."""
        num_holders = len(self.req_to_blocks)
        count = 0
        for block in self.req_to_blocks.get(request_id, _NO_BLOCKS):
            if block.ref_cnt != num_holders:
                break
            count += 1
        return count

    def reset_prefix_cache(self) -> bool:
        self.flush_deferred()
        return self.block_pool.reset_prefix_cache()
