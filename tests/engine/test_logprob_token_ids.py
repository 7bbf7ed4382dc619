"""vLLM's logprob_token_ids: each output position's logprobs are the sampled token's and the
tracked ids', against transformers' log-softmax of the same weights."""

from __future__ import annotations

import random

import pytest
import torch

from cadence import LLM, SamplingParams
from tests.hf_models import VOCAB, build_hf_model

TRACKED = [7, 3, 40, 7]  # a repeat: one entry, ranked by its later place (vLLM's)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    model = build_hf_model("llama", path)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (5, 17, 33)]
    return path, model, prompts


def _log_softmax_after(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_tracked_logprobs_match_transformers(hf, async_scheduling):
    path, model, prompts = hf
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="float32", max_num_seqs=4, max_model_len=128,
              async_scheduling=async_scheduling)
    tracked = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                             logprob_token_ids=TRACKED)
    top = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
    plain = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], [tracked, top, plain],
                        use_tqdm=False)
    assert outs[2].outputs[0].logprobs is None
    for prompt, out, k in zip(prompts[:2], outs[:2], (None, 2)):
        c = out.outputs[0]
        lp = _log_softmax_after(model, prompt + list(c.token_ids))
        assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
        total = 0.0
        for i, (tok, row) in enumerate(zip(c.token_ids, c.logprobs)):
            want = lp[len(prompt) - 1 + i]
            assert int(want.argmax()) == tok  # greedy
            total += float(want[tok])
            if k is None:
                # The sampled token first, then the tracked ids in their order, once each;
                # a tracked id's rank is its place (the later one for a repeat).
                assert list(row) == list(dict.fromkeys([tok] + TRACKED))
                ranks = {t: TRACKED.index(t) + 1 for t in TRACKED}
                ranks[7] = 4
                for t, entry in row.items():
                    assert entry.logprob == pytest.approx(float(want[t]), abs=1e-4)
                    assert entry.rank == ranks.get(t, int((want >= want[t]).sum()))
            else:
                assert set(want.topk(k).indices.tolist()) <= set(row)
        assert c.cumulative_logprob == pytest.approx(total, abs=1e-3)


def test_tracked_ids_checked_on_the_way_in(hf):
    path, _, prompts = hf
    llm = LLM(str(path), skip_tokenizer_init=True, max_model_len=128)
    prompt = {"prompt_token_ids": prompts[0]}
    with pytest.raises(ValueError, match="logprob_token_ids"):
        llm.generate(prompt, SamplingParams(max_tokens=2, logprob_token_ids=[VOCAB]),
                     use_tqdm=False)
    with pytest.raises(ValueError, match="logprob_token_ids"):
        SamplingParams(logprob_token_ids=[1, 2], logprobs=3)
    with pytest.raises(ValueError, match="logprob_token_ids"):
        SamplingParams(logprob_token_ids=list(range(129)))
    with pytest.raises(ValueError, match="logprob_token_ids"):
        SamplingParams(logprob_token_ids=[1, -2])
    # With logprobs equal to their count, and an empty list (vLLM: no logprobs asked).
    both = SamplingParams(temperature=0.0, max_tokens=2, logprob_token_ids=[1, 2], logprobs=2)
    empty = SamplingParams(temperature=0.0, max_tokens=2, logprob_token_ids=[])
    out_both, out_empty = llm.generate([prompt, prompt], [both, empty], use_tqdm=False)
    c = out_both.outputs[0]
    assert [list(row) for row in c.logprobs] == [list(dict.fromkeys([t, 1, 2]))
                                                 for t in c.token_ids]
    assert out_empty.outputs[0].logprobs is None
