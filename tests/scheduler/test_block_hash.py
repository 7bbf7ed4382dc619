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
