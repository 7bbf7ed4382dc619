"""Block hashes: chained over the whole prefix, stable, computed as blocks fill."""

from __future__ import annotations

import hashlib
import struct

from cadence.sampling_params import SamplingParams
from cadence.scheduler.block_hash import ROOT_HASH, hash_block_tokens, make_block_hasher
from cadence.scheduler.request import Request


def _request(tokens: list[int], block_size: int = 4) -> Request:
    return Request("r", tokens, SamplingParams(), block_hasher=make_block_hasher(block_size))


def test_hash_is_sha256_of_parent_and_little_endian_ids():
    expected = hashlib.sha256(ROOT_HASH + struct.pack("<3q", 1, 2, 3)).digest()
    assert hash_block_tokens(ROOT_HASH, [1, 2, 3]) == expected


def test_chaining_covers_the_whole_prefix():
    a = _request([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(a.block_hashes) == 2  # the partial third block has no hash
    h0 = hash_block_tokens(ROOT_HASH, [1, 2, 3, 4])
    assert a.block_hashes == [h0, hash_block_tokens(h0, [5, 6, 7, 8])]
    # Same second block after a different first block: different hash.
    b = _request([9, 2, 3, 4, 5, 6, 7, 8])
    assert b.block_hashes[1] != a.block_hashes[1]
    # Same prefix: same hashes (hashes are deterministic, not per process).
    assert _request([1, 2, 3, 4, 5, 6, 7, 8]).block_hashes == a.block_hashes


def test_hashes_follow_output_tokens():
    req = _request([1, 2, 3])
    assert req.block_hashes == []
    req.append_output_token_ids(4)
    assert req.block_hashes == [hash_block_tokens(ROOT_HASH, [1, 2, 3, 4])]
    req.append_output_token_ids([5, 6, 7])
    assert len(req.block_hashes) == 1
    req.append_output_token_ids([8, 9, 10, 11, 12])
    assert len(req.block_hashes) == 3
    assert req.block_hashes == _request(list(range(1, 13))).block_hashes


def test_a_cache_salt_changes_every_hash_and_equal_salts_agree() -> None:
    from cadence.sampling_params import SamplingParams
    from cadence.scheduler.block_hash import ROOT_HASH, make_block_hasher, salted_root
    from cadence.scheduler.request import Request

    hasher = make_block_hasher(4)
    tokens = list(range(10))  # two full blocks

    def hashes(salt):
        return Request("r", tokens, SamplingParams(), block_hasher=hasher,
                       cache_salt=salt).block_hashes

    plain, a, a2, b = hashes(None), hashes("a"), hashes("a"), hashes("b")
    assert len(plain) == 2 and a == a2
    assert not set(plain) & set(a) and not set(a) & set(b)
    assert salted_root(None) == ROOT_HASH != salted_root("")


def test_salts_with_lone_surrogates_hash_apart() -> None:
    """A Python str may hold a lone surrogate (offline callers; the server refuses them): each
    such salt is hashed as it is, not replaced, so two of them never share a cache."""
    from cadence.scheduler.block_hash import salted_root

    roots = {salted_root(s) for s in ("\ud800", "\ud801", "?", "\ufffd")}
    assert len(roots) == 4


def _counting_hasher(block_size: int):
    """make_block_hasher's hasher, recording how many blocks each call hashed (calls that
    hash none are not recorded)."""
    inner = make_block_hasher(block_size)
    calls: list[int] = []

    def hasher(request, hashes, num_blocks):
        new = inner(request, hashes, num_blocks)
        if new:
            calls.append(len(new))
        return new

    return hasher, calls


def test_blocks_are_hashed_when_first_needed_and_agree_with_hashing_all_at_once():
    hasher, calls = _counting_hasher(4)
    tokens = list(range(1, 23))  # five full blocks and two tokens
    req = Request("r", tokens, SamplingParams(), block_hasher=hasher)
    assert calls == []  # nothing on admission
    expected, parent = [], ROOT_HASH
    for i in range(5):
        parent = hash_block_tokens(parent, tokens[4 * i: 4 * i + 4])
        expected.append(parent)
    assert req.hash_blocks(2) == expected[:2] and calls == [2]
    assert req.hash_blocks(1) == expected[:2] and calls == [2]  # never shrinks, no new work
    assert req.hash_blocks(9) == expected and calls == [2, 3]  # only full blocks
    assert req.block_hashes == expected and calls == [2, 3]
    req.append_output_token_ids([23, 24])
    assert calls == [2, 3]  # a filled block waits for the next need
    assert req.block_hashes == expected + [hash_block_tokens(expected[-1], [21, 22, 23, 24])]


def test_a_prefix_lookup_hashes_only_as_far_as_it_hits():
    from cadence.scheduler.kv_cache_manager import KVCacheManager

    hasher, calls = _counting_hasher(4)
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_caching=True, max_model_len=200)
    miss = Request("a", list(range(100, 180)), SamplingParams(), block_hasher=hasher)
    assert kv.get_computed_blocks(miss) == ([], 0)
    assert sum(calls) == 1  # a miss on the first block hashes one block, not twenty
    calls.clear()
    shared = list(range(1, 41))  # ten full blocks
    first = Request("b", shared + [7], SamplingParams(), block_hasher=hasher)
    kv.allocate_slots(first, 41)  # registers its ten full blocks
    assert sum(calls) == 10
    calls.clear()
    second = Request("c", shared[:24] + [99] * 20, SamplingParams(), block_hasher=hasher)
    hits, num_hit_tokens = kv.get_computed_blocks(second)
    assert num_hit_tokens == 24 and len(hits) == 6
    # Hashed in doubling runs (1, 1, 2, 4: blocks 0-7) past its six hits, not all 11 blocks.
    assert calls == [1, 1, 2, 4]
