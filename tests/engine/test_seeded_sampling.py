"""Seeded sampling end to end on the tiny model (CPU): a seeded request draws fresh noise at every
step, and its tokens depend on its seed alone, not on the run, the batch or the sampling path."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from cadence import LLM, SamplingParams

PROMPT = [72, 101, 278, 111, 295]
OTHER_PROMPTS = [[84, 104, 101, 32, 113, 117], [65, 32, 115, 109, 97], [300, 301, 302]]
N_TOKENS = 32


def _seeded(seed: int, **kw: object) -> SamplingParams:
    # Temperature 2 flattens the tiny model's next-token distribution over hundreds of tokens.
    return SamplingParams(temperature=2.0, seed=seed, max_tokens=N_TOKENS, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    engine = LLM("tiny", device="cpu", max_model_len=128, num_gpu_blocks_override=64,
                 max_num_seqs=8, async_scheduling=False, skip_tokenizer_init=True)
    yield engine
    engine.shutdown()


def _generate(llm: LLM, requests: list[tuple[list[int], SamplingParams]]) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in requests],
                        [params for _, params in requests], use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_seeded_tokens_vary_from_step_to_step_and_repeat(llm: LLM) -> None:
    (tokens,) = _generate(llm, [(PROMPT, _seeded(123))])
    assert len(tokens) == N_TOKENS
    # 32 draws spread over hundreds of tokens are nearly all distinct (about 30 here). A sampler
    # that drew the same noise at every step keeps picking the token whose noise is smallest:
    # one to three distinct tokens, one of them most of the time.
    assert len(set(tokens)) >= 16
    assert Counter(tokens).most_common(1)[0][1] <= 8
    # A second run (its prompt now a prefix-cache hit) gives the same tokens.
    assert _generate(llm, [(PROMPT, _seeded(123))]) == [tokens]


def test_seeded_tokens_do_not_depend_on_the_batch(llm: LLM) -> None:
    (alone,) = _generate(llm, [(PROMPT, _seeded(123))])
    batch = [
        (OTHER_PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)),
        (OTHER_PROMPTS[1], SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True)),
        (PROMPT, _seeded(124)),
        (PROMPT, _seeded(123)),
        (OTHER_PROMPTS[2], _seeded(123, top_k=20, top_p=0.9)),
        (OTHER_PROMPTS[0], SamplingParams(temperature=0.7, top_p=0.8, max_tokens=25)),
    ]
    outs = _generate(llm, batch)
    assert outs[3] == alone
    # Another seed, same prompt: another sequence, equal at hardly any position.
    other = outs[2]
    assert len(other) == N_TOKENS and other != alone
    assert sum(a == b for a, b in zip(other, alone)) <= 4


def test_seeded_top_k_tokens_do_not_depend_on_the_sampling_path(llm: LLM) -> None:
    """When every sampled request has a top-k the batch samples from its top-k candidates; next
    to a request without top-k it sorts the whole vocabulary. The tokens must be the same."""
    top_k = [(PROMPT, _seeded(5, top_k=3)), (OTHER_PROMPTS[2], _seeded(6, top_k=40))]
    candidates = _generate(llm, top_k)
    no_top_k = SamplingParams(temperature=1.0, max_tokens=N_TOKENS, ignore_eos=True)
    full_sort = _generate(llm, [*top_k, (OTHER_PROMPTS[1], no_top_k)])[:2]
    assert full_sort == candidates
    # Top-k 3 at temperature 2: all three candidates are likely, so a path that kept a wrong set
    # would soon sample a different token. The draws really vary (about 28 distinct tokens).
    assert all(len(set(tokens)) >= 16 for tokens in candidates)


def test_min_p_one_keeps_only_the_most_likely_token(llm: LLM) -> None:
    """min_p = 1 keeps the tokens at least as likely as the most likely one: sampling at any
    temperature and seed is then the greedy answer (and min_p reaches the sampler at all)."""
    greedy = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)
    (want,) = _generate(llm, [(PROMPT, greedy)])
    got = _generate(llm, [(PROMPT, _seeded(seed, min_p=1.0)) for seed in (1, 2, 3)])
    assert got == [want] * 3
    # Without it the same seeds wander off the greedy answer.
    assert _generate(llm, [(PROMPT, _seeded(1))])[0] != want
