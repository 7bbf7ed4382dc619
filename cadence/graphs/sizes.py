"""Batch-size buckets for decode graphs (vLLM's capture-size list)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence


def capture_sizes(max_num_seqs: int) -> list[int]:
    """``[1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)`` capped at ``max_num_seqs``.

    Granularity policy: when ``max_num_seqs`` is not itself on that list it is appended as the
    last size, exactly (not rounded up), so the largest graph has exactly ``max_num_seqs`` rows
    and the runner's static buffers need no more rows than ``max_num_seqs``.
    """
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be at least 1, got {max_num_seqs}")
    pattern = [1, 2, 4, *range(8, 256, 8), *range(256, max_num_seqs + 1, 16)]
    sizes = [s for s in pattern if s <= max_num_seqs]
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


def padded_batch_size(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest size in ascending ``sizes`` that holds ``n`` rows; None if none does
    (``n`` < 1 or larger than every size: such a batch runs eagerly)."""
    if n < 1:
        return None
    i = bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None
