"""Penalties, logit bias, allowed ids, min_p and bad words through the whole engine.

Greedy tokens equal transformers' (``generate`` with repetition_penalty; a step-by-step loop with
the OpenAI definitions for the rest) on a random checkpoint, in every engine configuration:
async scheduling on and off, chunked prefill, preemption.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from cadence import LLM, SamplingParams
from tests.hf_models import VOCAB, build_hf_model
from tests.tiny import tiny_args

NEW_TOKENS = 24
CONFIGS = {
    "plain": dict(),
    "chunked": dict(max_num_batched_tokens=16),
    "preempt": dict(num_gpu_blocks_override=14, max_num_batched_tokens=64),
}


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (5, 17, 33, 50)]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    return path, build_hf_model("qwen3", path)


def _reference(model, prompt: list[int], process: Callable[[list[int], list[int], torch.Tensor],
                                                             torch.Tensor]) -> list[int]:
    """Greedy decoding with ``process(prompt, outputs, logits) -> logits`` before each argmax."""
    out: list[int] = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids = torch.tensor([prompt + out])
            logits = model(ids).logits[0, -1].float()
            out.append(int(process(prompt, out, logits.clone()).argmax()))
    return out


def _engine(path, config: str, async_scheduling: bool) -> LLM:
    # float32: transformers' reference runs in float32 (a GPU engine defaults to bfloat16).
    return LLM(str(path), skip_tokenizer_init=True, max_num_seqs=8, max_model_len=256,
               dtype="float32", async_scheduling=async_scheduling, **CONFIGS[config])


def _generate(llm: LLM, prompts, params) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_repetition_penalty_matches_transformers_generate(hf, config, async_scheduling):
    path, model = hf
    prompts = _prompts()
    expected = []
    model.generation_config.eos_token_id = None
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                 repetition_penalty=1.8, eos_token_id=None, pad_token_id=0)
        expected.append(gen[0, len(p):].tolist())
    llm = _engine(path, config, async_scheduling)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
                            repetition_penalty=1.8)
    assert _generate(llm, prompts, params) == expected
    plain = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    assert _generate(llm, prompts, plain) != expected  # the penalty did change the result
    if config == "preempt":
        assert llm.engine_core.make_stats().num_preemptions > 0


def _freq_presence(freq: float, pres: float):
    def process(prompt, out, logits):
        for tok in set(out):
            logits[tok] -= freq * out.count(tok) + pres
        return logits
    return process


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_frequency_presence_bias_allowed_in_one_batch(hf, config, async_scheduling):
    """Rows with different processors (and none) share every step."""
    path, model = hf
    prompts = _prompts(1)
    allowed = list(range(3, VOCAB, 7))
    bias = {11: 3.0, 12: -50.0, 100: 2.5}

    def add_bias(prompt, out, logits):
        for tok, b in bias.items():
            logits[tok] += b
        return logits

    def only_allowed(prompt, out, logits):
        masked = torch.full_like(logits, float("-inf"))
        masked[allowed] = logits[allowed]
        return masked

    cases = [
        (dict(frequency_penalty=2.0), _freq_presence(2.0, 0.0)),
        (dict(presence_penalty=1.5, frequency_penalty=-0.5), _freq_presence(-0.5, 1.5)),
        (dict(logit_bias=bias), add_bias),
        (dict(allowed_token_ids=allowed), only_allowed),
    ]
    expected = [_reference(model, p, proc) for p, (_, proc) in zip(prompts, cases)]
    llm = _engine(path, config, async_scheduling)
    params = [SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, **kw)
              for kw, _ in cases]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert all(t in allowed for t in outs[3].outputs[0].token_ids)


def test_seeded_sampling_with_penalties_and_min_p_async_equals_sync(hf):
    """The counts include the token still in flight: async on == off, sampled tokens too."""
    path, _ = hf
    prompts = _prompts(2)
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=NEW_TOKENS, ignore_eos=True,
                             frequency_penalty=1.0, presence_penalty=0.5, min_p=0.05,
                             repetition_penalty=1.2) for i in range(len(prompts))]
    got = [_generate(_engine(path, "chunked", a), prompts, params) for a in (False, True)]
    assert got[0] == got[1]


def _contains(seq: list[int], word: list[int]) -> bool:
    return any(seq[i : i + len(word)] == word for i in range(len(seq) - len(word) + 1))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_bad_words_are_never_generated(async_scheduling):
    """A two-token word the model generates unprompted is banned: the outputs never contain it,
    and they equal a reference that bans the word's last token after its first."""
    llm = LLM(**vars(tiny_args(async_scheduling=async_scheduling)))
    tok = llm.get_tokenizer()
    prompt = "the cat sat on the"
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    free = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
    word_ids = None
    for i in range(2, len(free) - 1):
        pair = free[i : i + 2]
        text = tok.decode(pair)
        if text.strip() and text == text.lstrip() and tok.encode(
                text, add_special_tokens=False) == pair:
            word_ids, word = pair, text
            break
    assert word_ids is not None, f"no two-token word in {free}"
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, bad_words=[word])
    out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    assert not _contains(out, word_ids)
    assert out[: free.index(word_ids[0])] == free[: free.index(word_ids[0])]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_largest_biases_keep_their_meaning(temperature):
    """Biases at the bound (1e30) stay finite in float32: +1e30 forces its token, and -1e30 on
    every allowed token still samples among the allowed ones (a bias that overflowed to inf
    made the row NaN and sampled token 0)."""
    llm = LLM(**vars(tiny_args()))
    kw = dict(max_tokens=4, temperature=temperature, seed=1, ignore_eos=True)
    out = llm.generate(["Hello"] * 2, [SamplingParams(logit_bias={9: 1e30}, **kw),
                                   SamplingParams(allowed_token_ids=[5, 6],
                                                  logit_bias={5: -1e30, 6: -1e30}, **kw)],
                       use_tqdm=False)
    assert out[0].outputs[0].token_ids == [9, 9, 9, 9]
    assert set(out[1].outputs[0].token_ids) <= {5, 6}
    # A penalty that pushes those biases past float32 leaves the row no token: the request
    # fails (it sampled token 0, outside allowed_token_ids).
    prompt = {"prompt_token_ids": [5, 6, 7]}
    (over,) = llm.generate([prompt], SamplingParams(
        allowed_token_ids=[5, 6], logit_bias={5: -1e30, 6: -1e30}, repetition_penalty=1e9, **kw),
        use_tqdm=False)
    assert over.outputs[0].finish_reason == "error" and over.outputs[0].token_ids == []
    assert llm.engine_core.num_free_kv_blocks == llm.engine_core.num_kv_blocks - 1
    llm.shutdown()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_bias_of_minus_inf_bans_its_token(temperature):
    """vLLM takes -inf as a ban: the request's tokens are those it makes with the token
    masked out by allowed_token_ids (every other id allowed), greedy or seeded; a row whose
    every token is banned so ends the request with "error", freeing its blocks."""
    llm = LLM(**vars(tiny_args()))
    kw = dict(max_tokens=12, temperature=temperature, seed=3, ignore_eos=True)
    free = llm.generate(["Hello"], SamplingParams(**kw), use_tqdm=False)[0].outputs[0].token_ids
    banned = free[0]
    vocab = llm.engine_core.vocab_size
    (ban,) = llm.generate(["Hello"], SamplingParams(logit_bias={banned: float("-inf")}, **kw),
                          use_tqdm=False)
    (mask,) = llm.generate(["Hello"], SamplingParams(
        allowed_token_ids=[t for t in range(vocab) if t != banned], **kw), use_tqdm=False)
    assert banned not in ban.outputs[0].token_ids
    assert ban.outputs[0].token_ids == mask.outputs[0].token_ids
    (none,) = llm.generate(["Hello"], SamplingParams(
        allowed_token_ids=[5, 6], logit_bias={5: float("-inf"), 6: float("-inf")}, **kw),
        use_tqdm=False)
    assert none.outputs[0].finish_reason == "error" and none.outputs[0].token_ids == []
    assert llm.engine_core.num_free_kv_blocks == llm.engine_core.num_kv_blocks - 1
    llm.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_bad_words_survive_preemption(async_scheduling):
    """A request with bad_words, preempted after it has produced tokens and resumed, keeps its
    history: its tokens equal those it produces alone (greedy)."""
    prompt = "the cat sat on the"
    word = " mat"  # banned from the start; a multi-token word needs the history to be banned
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, bad_words=[word])
    filler = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    alone = LLM(**vars(tiny_args(async_scheduling=async_scheduling)))
    want = alone.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    # Four requests of 18 + 48 tokens want 20 blocks of 16; 12 make the last one (the victim
    # under fcfs) give its blocks back once it has outputs, then resume.
    llm = LLM(**vars(tiny_args(async_scheduling=async_scheduling, num_gpu_blocks_override=12)))
    prompts = ["a dog ran in the", "my hat is on a", "we sat by the", prompt]
    outs = llm.generate(prompts, [filler] * 3 + [params], use_tqdm=False)
    assert llm.engine_core.make_stats().num_preemptions > 0
    assert outs[3].outputs[0].token_ids == want
