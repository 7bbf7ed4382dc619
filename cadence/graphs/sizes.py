"""Buckets for CUDA graphs: batch sizes of decode steps (vLLM's capture-size list) and token
counts of mixed prefill/decode steps."""

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


def token_capture_sizes(max_tokens: int, min_tokens: int = 16) -> list[int]:
    """Token counts of mixed-step graphs, ascending, up to ``max_tokens`` (appended exactly).

    Steps of 16 tokens up to 256, then eight sizes per doubling (at most 12.5% of a step is
    padding above 256 tokens): 272 graphs would be needed at 16-token granularity up to 4096,
    this list has 48. Empty when ``max_tokens`` < ``min_tokens`` (no mixed graphs).
    """
    if max_tokens < min_tokens:
        return []
    sizes = list(range(min_tokens, min(max_tokens, 256) + 1, 16))
    size, step = 256, 32
    while size + step <= max_tokens:
        size += step
        sizes.append(size)
        if size & (size - 1) == 0:  # a power of two: the next doubling has coarser steps
            step *= 2
    if sizes[-1] != max_tokens:
        sizes.append(max_tokens)
    return sizes


# A dense attention pass over a graph bucket attends its padding rows too (work ~ rows^2); the
# varlen kernel attends the prompt's tokens only. Dense wins by 1.2-1.5x (cuDNN from 1024 tokens,
# docs/perf.md run BV; the Triton kernel from 128, runs ZZN-ZZP): padding may add this much work.
DENSE_PADDING_WORK = 1.15


def dense_padding_ok(tokens: int, size: int) -> bool:
    """Whether a lone prompt of ``tokens`` tokens in a graph bucket of ``size`` rows is worth
    attending densely: the padded pass's causal work at most ``DENSE_PADDING_WORK`` times the
    prompt's own."""
    return 0 < tokens <= size and size * size <= DENSE_PADDING_WORK * tokens * tokens


def padded_batch_size(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest size in ascending ``sizes`` that holds ``n`` rows; None if none does
    (``n`` < 1 or larger than every size: such a batch runs eagerly)."""
    if n < 1:
        return None
    i = bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None
