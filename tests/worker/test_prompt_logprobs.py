"""score_prompt: each prompt token's logprob, rank and its position's top-k, computed in slices
of positions; checked against a direct computation over hand-made logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadence.worker import prompt_logprobs
from cadence.worker.prompt_logprobs import PromptChunk, score_prompt

VOCAB = 11


@pytest.mark.parametrize("k", [0, 3])
def test_scores_across_slices_with_ties(monkeypatch, k: int) -> None:
    monkeypatch.setattr(prompt_logprobs, "_SLICE", 4)  # 10 positions: slices of 4, 4, 2
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(12, VOCAB, generator=gen)
    hidden[5, [2, 7]] = hidden[5].max() + 1.0  # position 5: tokens 2 and 7 tied for best
    targets = torch.randint(0, VOCAB, (10,), generator=gen)
    targets[4] = 7  # position 5 (flat 1 + 4) predicts the second of the tied pair
    chunk = PromptChunk("r", first=1, flat=1, targets=targets.numpy().astype(np.int64), k=k)
    out = score_prompt(hidden, chunk, lambda h: h)
    lp = torch.log_softmax(hidden[1:11], dim=-1)
    want_lp = lp[torch.arange(10), targets]
    assert torch.equal(out.logprob_token_ids[:, 0], targets)
    torch.testing.assert_close(out.logprobs[:, 0], want_lp)
    # Rank (vLLM's): how many tokens are at least as likely as the target.
    want_rank = [int((row >= row[t]).sum()) for row, t in zip(lp, targets.tolist())]
    assert out.sampled_token_ranks.tolist() == want_rank and want_rank[4] == 2
    assert out.logprob_token_ids.shape == (10, 1 + k)
    if k:
        top = lp.topk(k, dim=-1)
        torch.testing.assert_close(out.logprobs[:, 1:], top.values)
        assert set(out.logprob_token_ids[4, 1:3].tolist()) == {2, 7}
