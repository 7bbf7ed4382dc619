"""score_prompt: each prompt token's logprob, rank and its position's top-k, computed in slices
of positions; checked against a direct computation over hand-made logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadence.runner_output import LogprobsLists, ModelRunnerOutput
from cadence.worker import prompt_logprobs
from cadence.worker.prompt_logprobs import PromptChunk, WithPromptLogprobs, score_prompt
from cadence.worker.sampler import LogprobsTensors

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


def test_bf16_logits_score_in_float32() -> None:
    """A bfloat16 model's logits: the log-softmax runs in float32, so each logprob is the
    float64 log-softmax of those logits to float32's precision, not bfloat16's (~1e-2)."""
    gen = torch.Generator().manual_seed(1)
    hidden = (torch.randn(6, VOCAB, generator=gen) * 3).to(torch.bfloat16)
    targets = torch.randint(0, VOCAB, (5,), generator=gen)
    chunk = PromptChunk("r", first=1, flat=0, targets=targets.numpy().astype(np.int64), k=2)
    out = score_prompt(hidden, chunk, lambda h: h)
    lp = torch.log_softmax(hidden[:5].double(), dim=-1)
    assert out.logprobs.dtype == torch.float32
    torch.testing.assert_close(out.logprobs[:, 0].double(), lp[torch.arange(5), targets],
                               atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.logprobs[:, 1:].double(), lp.topk(2, dim=-1).values,
                               atol=1e-6, rtol=1e-6)


class _Recorded:
    """Scored tensors whose read to the host is logged."""

    def __init__(self, tensors: LogprobsTensors, log: list[str]) -> None:
        self.tensors, self.log = tensors, log

    def tolists(self) -> LogprobsLists:
        self.log.append("read")
        return self.tensors.tolists()


@pytest.mark.parametrize("waits", [False, True])
def test_output_gets_each_request_scored_after_the_wait(waits: bool) -> None:
    log: list[str] = []

    class Inner:
        def get_output(self) -> ModelRunnerOutput:
            log.append("output")
            return ModelRunnerOutput(["a", "b"], {"a": 0, "b": 1}, [[4], []])

    a = LogprobsTensors(torch.tensor([[5, 2]]), torch.tensor([[-1.5, -0.25]]), torch.tensor([3]))
    b = LogprobsTensors(torch.tensor([[1], [7]]), torch.tensor([[-0.5], [-2.0]]),
                        torch.tensor([1, 4]))
    scored = {"a": (3, _Recorded(a, log)), "b": (1, _Recorded(b, log))}
    wrapped = WithPromptLogprobs(Inner(), scored,  # type: ignore[arg-type]
                                 (lambda: log.append("wait")) if waits else None)
    out = wrapped.get_output()
    assert log == ["output", *(["wait"] if waits else []), "read", "read"]
    assert out.sampled_token_ids == [[4], []]
    assert out.prompt_logprobs == {
        "a": (3, LogprobsLists([[5, 2]], [[-1.5, -0.25]], [3])),
        "b": (1, LogprobsLists([[1], [7]], [[-0.5], [-2.0]], [1, 4])),
    }
