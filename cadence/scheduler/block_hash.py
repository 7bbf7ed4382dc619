"""Prefix-cache block hashes: sha256 of (parent hash, the block's token ids), chained per request.

Two requests share a cached block only when every token before and inside it is identical, so
the hash of block ``i`` covers the whole prefix ``[0, (i + 1) * block_size)``. A request's
``cache_salt`` goes into its first block's parent, so requests with different salts (or one
with and one without) share nothing; so do requests whose keys take longrope's long factors
and those whose keys take its short ones (``Request.rope_long``).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cadence.scheduler.request import Request

# Parent of a request's first block. Fixed, so hashes are stable across processes and runs.
ROOT_HASH = hashlib.sha256(b"cadence.prefix-cache.root").digest()


def salted_root(salt: str | None, root_hash: bytes = ROOT_HASH) -> bytes:
    """The parent of a request's first block: ``root_hash``, mixed with the salt if any."""
    if salt is None:
        return root_hash
    return hashlib.sha256(root_hash + b"salt:" + salt.encode("utf-8", "surrogatepass")).digest()


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """The bytes a block's ids are hashed as: little-endian int64, 8 per id."""
    return struct.pack(f"<{len(token_ids)}q", *token_ids)


def hash_block_bytes(parent_hash: bytes, payload: bytes) -> bytes:
    """Hash one full block from its packed ids: the parent's digest followed by them."""
    return hashlib.sha256(parent_hash + payload).digest()


def hash_block_tokens(parent_hash: bytes, token_ids: Sequence[int]) -> bytes:
    """Hash one full block: the parent's digest followed by the ids as little-endian int64."""
    return hash_block_bytes(parent_hash, pack_tokens(token_ids))


def make_block_hasher(
    block_size: int, root_hash: bytes = ROOT_HASH
) -> Callable[[Request, list[bytes], int | None], list[bytes]]:
    """Return the hasher to pass as ``Request(block_hasher=...)``.

    ``hasher(request, hashes, num_blocks)`` returns the hashes of the request's full blocks
    after the ``len(hashes)`` already in ``hashes`` (chained to ``hashes[-1]``), up to block
    ``num_blocks`` (every full block when None); possibly none.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}.")

    def hasher(request: Request, hashes: list[bytes], num_blocks: int | None) -> list[bytes]:
        tokens = request.all_token_ids
        start = len(hashes) * block_size
        full = (len(tokens) - start) // block_size
        if num_blocks is not None and len(hashes) + full > num_blocks:
            full = num_blocks - len(hashes)
        if full <= 0:
            return []
        if hashes:
            parent = hashes[-1]
        else:
            parent = salted_root(request.cache_salt, root_hash)
            if request.rope_long:  # keys of the other rotation: never the same block
                parent = hashlib.sha256(parent + b"rope:long").digest()
        # One pack for every new block, hashed block by block in slices of it.
        payload = pack_tokens(tokens[start : start + full * block_size])
        step = 8 * block_size
        new_hashes: list[bytes] = []
        for offset in range(0, full * step, step):
            parent = hash_block_bytes(parent, payload[offset : offset + step])
            new_hashes.append(parent)
        return new_hashes

    return hasher
