"""The Triton kernel behind grammar_mask: one program per (grammar row, block of the vocabulary)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def apply_bitmask_kernel(logits_ptr, logits_stride, words_ptr, words_stride, rows_ptr,
                         vocab_size, mask_vocab, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < vocab_size
    row = tl.load(rows_ptr + i).to(tl.int64)
    known = offs < mask_vocab
    words = tl.load(words_ptr + i * words_stride + offs // 32, mask=inside & known, other=0)
    # Ids the grammar does not know (the model's padding) are banned.
    banned = (((words >> (offs % 32)) & 1) == 0) | (offs >= mask_vocab)
    tl.store(logits_ptr + row * logits_stride + offs, float("-inf"), mask=inside & banned)
