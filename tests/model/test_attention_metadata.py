"""AttentionMetadata's derived views: which steps count as decode-only (one query token per
sequence: the decode kernel's steps) and how many sequences a step has."""

from __future__ import annotations

import pytest
import torch

from cadence.model.attention_metadata import AttentionMetadata


def _metadata(query_lens: list[int], context: int = 5) -> AttentionMetadata:
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    tokens = int(starts[-1])
    return AttentionMetadata(
        num_actual_tokens=tokens, max_query_len=max(query_lens, default=0),
        max_seq_len=context + max(query_lens, default=0), query_start_loc=starts,
        seq_lens=torch.tensor([context + n for n in query_lens], dtype=torch.int32),
        block_tables=torch.zeros(len(query_lens), 4, dtype=torch.int32),
        slot_mapping=torch.arange(tokens, dtype=torch.int64))


@pytest.mark.parametrize(("query_lens", "decode"), [
    ([1], True), ([1, 1, 1], True),
    ([2], False),  # two tokens of one sequence: the second attends the first (varlen)
    ([1, 2, 1], False), ([7], False), ([1, 1, 16], False),
])
def test_decode_only_means_one_query_token_per_sequence(query_lens, decode):
    md = _metadata(query_lens)
    assert md.is_decode_only is decode
    assert md.num_seqs == len(query_lens)
