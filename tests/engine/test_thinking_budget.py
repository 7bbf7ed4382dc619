"""thinking_token_budget through the engine, against transformers: after ``budget`` tokens
inside the reasoning block the end tag comes, then the model goes on from it. The expected
tokens are transformers' greedy tokens: its free continuation up to the forced position, then
the end tag, then its continuation of all that."""

from __future__ import annotations

import random

import pytest

from cadence import LLM, SamplingParams
from tests.hf_models import VOCAB, build_hf_model, hf_greedy

START, END = 5, 6  # the reasoning tags, as token ids of the test model
NEW = 16


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("thinking")
    return path, build_hf_model("qwen3", path)


def _expected(hf, prompt: list[int], budget: int) -> list[int]:
    """Transformers' tokens with the end tag put where the budget runs out."""
    last = max(i for i, t in enumerate(prompt) if t == START)
    assert END not in prompt[last:]
    free = max(0, budget - (len(prompt) - last - 1))  # thinking tokens the output may add
    head = hf_greedy(hf, [prompt], free)[0] if free else []
    assert START not in head and END not in head  # the model does not close it by itself
    rest = NEW - len(head) - 1
    tail = hf_greedy(hf, [prompt + head + [END]], rest)[0] if rest > 0 else []
    assert START not in tail  # no second block to count
    return (head + [END] + tail)[:NEW]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("chunk", [None, 16], ids=["whole", "chunked"])
def test_the_end_tag_comes_when_the_budget_runs_out(model, async_scheduling: bool,
                                                    chunk: int | None) -> None:
    path, hf = model
    rng = random.Random(3)
    body = [rng.randrange(10, VOCAB) for _ in range(30)]
    prompts = [body[:12] + [START], body[:20] + [START] + body[20:24], body + [START] + body[:3]]
    budgets = [0, 3, 9]
    llm = LLM(str(path), skip_tokenizer_init=True, max_model_len=128, max_num_seqs=8,
              dtype="float32", async_scheduling=async_scheduling,
              **({"max_num_batched_tokens": chunk} if chunk else {}))
    try:
        params = [SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True,
                                 thinking_token_budget=b, thinking_tags=(START, END))
                  for b in budgets]
        for prompt, budget in zip(prompts, budgets, strict=True):  # one at a time, then all
            (out,) = llm.generate([{"prompt_token_ids": prompt}], params[budgets.index(budget)],
                                  use_tqdm=False)
            assert list(out.outputs[0].token_ids) == _expected(hf, prompt, budget), budget
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outs]
        assert got == [_expected(hf, p, b) for p, b in zip(prompts, budgets, strict=True)]
        # No budget (or -1): the free continuation.
        free = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True,
                              thinking_token_budget=-1, thinking_tags=(START, END))
        (out,) = llm.generate([{"prompt_token_ids": prompts[0]}], free, use_tqdm=False)
        assert list(out.outputs[0].token_ids) == hf_greedy(hf, [prompts[0]], NEW)[0]
    finally:
        llm.shutdown()


def test_without_reasoning_tags_a_budget_is_refused(model) -> None:
    path, _ = model
    llm = LLM(str(path), skip_tokenizer_init=True, max_model_len=128)
    try:
        with pytest.raises(ValueError, match="thinking_token_budget needs a reasoning parser"):
            llm.generate([[10, 11]], SamplingParams(thinking_token_budget=4), use_tqdm=False)
        with pytest.raises(ValueError, match="out of vocabulary"):
            llm.generate([[10, 11]], SamplingParams(thinking_token_budget=4,
                                                    thinking_tags=(1, VOCAB)), use_tqdm=False)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("value", [-2, 1.5, True, "3"])
def test_bad_budgets_are_refused(value) -> None:
    with pytest.raises(ValueError, match="thinking_token_budget"):
        SamplingParams(thinking_token_budget=value)


def test_an_unknown_reasoning_parser_is_refused() -> None:
    from cadence.engine.engine_args import EngineArgs

    with pytest.raises(ValueError, match="reasoning_parser 'bogus' is not known; use one of "
                                         "deepseek_r1, qwen3"):
        EngineArgs(reasoning_parser="bogus").create_engine_config(64)


@pytest.mark.parametrize("reset_at", [3, 6, 9])
def test_a_forced_reset_mid_answer_keeps_the_count(model, reset_at: int) -> None:
    """A reset of the prefix cache that preempts the running request (vLLM's
    reset_running_requests) while a token is in flight: the request is readmitted, chunked,
    and its history must not take the earlier admission's late token (which once failed the
    engine); the answer is still transformers' with the end tag where the budget runs out.
    Bad words on the same path likewise."""
    path, hf = model
    rng = random.Random(4)
    prompt = [rng.randrange(10, VOCAB) for _ in range(40)] + [START]
    llm = LLM(str(path), skip_tokenizer_init=True, max_model_len=128, dtype="float32",
              async_scheduling=True, max_num_batched_tokens=16, max_num_seqs=4)
    core = llm.engine_core
    step, calls = core.step_with_batch_queue, [0]

    def stepping():
        calls[0] += 1
        if calls[0] == reset_at:
            assert core.reset_prefix_cache(reset_running_requests=True)
        return step()

    core.step_with_batch_queue = stepping
    try:
        params = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True,
                                thinking_token_budget=8, thinking_tags=(START, END))
        (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        assert list(out.outputs[0].token_ids) == _expected(hf, prompt, 8)
        assert core.make_stats().num_preemptions > 0
        calls[0] = 0
        banned = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
        banned.bad_words_token_ids = [[250, 251]]  # a word the model never writes
        (out,) = llm.generate([{"prompt_token_ids": prompt}], banned, use_tqdm=False)
        assert list(out.outputs[0].token_ids) == hf_greedy(hf, [prompt], NEW)[0]
    finally:
        llm.shutdown()
