"""Greedy tokens equal transformers' on tiny random checkpoints of each supported family.

Every engine configuration (plain, chunked prefill, preemption, prefix-cache hits, async
scheduling on and off) must give identical tokens.
"""

from __future__ import annotations

import random

import pytest
import torch

from cadence import LLM, SamplingParams
from cadence.core_types import EngineCoreRequest
from tests.hf_models import VOCAB, build_hf_model, hf_greedy, save_llama

NEW_TOKENS = 32
# transformers' reference runs in float32 (on a GPU the engine would take bfloat16).
F32 = "float32"


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [5, 17, 33, 50, 8]
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in lengths]


def _shared_prefix_prompts(seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, VOCAB) for _ in range(40)]
    return [prefix + [rng.randrange(3, VOCAB) for _ in range(n)] for n in (3, 9, 20, 1)]


@pytest.fixture(
    scope="module",
    params=[
        "llama", "llama-yarn", "mistral", "phi3", "phi4-mini", "gemma2", "gemma3", "qwen2",
        "qwen3", "qwen3-moe", "qwen2-window", "qwen3-moe-window",
    ],
)
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    model = build_hf_model(request.param, path)
    prompts = _prompts() + _shared_prefix_prompts()
    return path, prompts, hf_greedy(model, prompts, NEW_TOKENS)


CONFIGS = {
    "plain": dict(),
    "chunked": dict(max_num_batched_tokens=16),
    "preempt": dict(num_gpu_blocks_override=14, max_num_batched_tokens=64),
    "no_prefix_cache": dict(enable_prefix_caching=False),
}


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_matches_transformers(checkpoint, config, async_scheduling):
    path, prompts, expected = checkpoint
    llm = LLM(str(path), skip_tokenizer_init=True, dtype=F32, max_num_seqs=8, max_model_len=256,
              async_scheduling=async_scheduling, **CONFIGS[config])
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    got = [o.outputs[0].token_ids for o in outs]
    assert got == expected
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    if config == "preempt":
        assert llm.engine_core.make_stats().num_preemptions > 0
    if config == "plain":
        # A second round hits the prefix cache (full blocks of the first) and must not change
        # a single token.
        again = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in again] == expected
        assert llm.engine_core.make_stats().prefix_cache_hits > 0
        assert any(o.num_cached_tokens > 0 for o in again)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_eos_stops_like_transformers(tmp_path, async_scheduling):
    """EOS taken from the checkpoint's generation config ends requests exactly where transformers
    stops; with async scheduling the step already launched past EOS emits nothing."""

    model = build_hf_model("qwen3", tmp_path)
    prompts = _prompts()
    eos = hf_greedy(model, prompts, 24)[0][6]  # a token greedy decoding really produces
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    model.save_pretrained(tmp_path)
    expected = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=24, eos_token_id=eos, pad_token_id=0)
        expected.append(gen[0, len(p):].tolist())
    assert any(len(e) < 24 for e in expected)

    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype=F32, max_num_seqs=8, max_model_len=256,
              async_scheduling=async_scheduling)
    params = SamplingParams(temperature=0.0, max_tokens=24)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for out, exp in zip(outs, expected):
        completion = out.outputs[0]
        assert completion.token_ids == exp
        stopped = exp[-1] == eos
        assert completion.finish_reason == ("stop" if stopped else "length")


def test_prefill_chunks_that_sample_nothing(tmp_path):
    """One 50-token prompt at 16 tokens a step: steps 1-3 are prefill chunks in which no row
    samples (the runner skips the logits), step 4 ends the prompt and samples the first token;
    then one token a step, all transformers' greedy tokens."""
    model = build_hf_model("qwen3", tmp_path)
    prompt = _prompts()[3]
    assert len(prompt) == 50
    expected = hf_greedy(model, [prompt], 6)[0]
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype=F32, max_num_seqs=4, max_model_len=256,
              max_num_batched_tokens=16, async_scheduling=False)
    core = llm.engine_core
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    core.add_request(EngineCoreRequest("long", prompt, params))
    per_step: list[list[int]] = []
    while core.has_work():
        outs, _ = core.step_fn()
        per_step.append([t for o in outs.outputs for t in o.new_token_ids])
    assert per_step[:4] == [[], [], [], expected[:1]]
    assert [t for step in per_step for t in step] == expected
    assert core.num_free_kv_blocks == core.num_kv_blocks - 1
    # Beside a decoding request (which samples), the same chunks give the same tokens.
    outs = llm.generate([{"prompt_token_ids": prompt}, {"prompt_token_ids": _prompts()[0]}],
                        params, use_tqdm=False)
    assert outs[0].outputs[0].token_ids == expected


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_longrope_long_factors_like_transformers(tmp_path, async_scheduling):
    """Prompts longer than Phi-3's original length (32 here) run on the long factors from their
    prefill on, in transformers and here alike."""
    model = build_hf_model("phi3-long", tmp_path)
    rng = random.Random(4)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (33, 40, 57)]
    expected = hf_greedy(model, prompts, 24)
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype=F32, max_num_seqs=4, max_model_len=256,
              async_scheduling=async_scheduling)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected



@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
], ids=["linear", "yarn"])
def test_scaled_rope_runs_past_max_position_embeddings_like_transformers(tmp_path, scaling):
    """Linear and yarn scaling are made for max_position_embeddings x factor (yarn: the
    original length x factor; vLLM's derivation): max_model_len may reach it, and sequences
    past max_position_embeddings (64 here) keep transformers' tokens."""
    model = save_llama(tmp_path, rope_scaling=dict(scaling))
    rng = random.Random(5)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (60, 90, 20)]
    expected = hf_greedy(model, prompts, 24)
    limit = 256 if scaling["rope_type"] == "linear" else 128
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype=F32, max_model_len=limit,
              max_num_batched_tokens=32)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    with pytest.raises(ValueError, match=f"{limit} with its RoPE scaling"):
        LLM(str(tmp_path), skip_tokenizer_init=True, max_model_len=limit + 1)
    # vLLM's default is the scaled length too.
    from cadence.model.registry import resolve_model

    assert resolve_model(str(tmp_path)).max_model_len == limit


@pytest.fixture(scope="module")
def longrope_checkpoint(tmp_path_factory):
    """Phi-3 with longrope switching at 32 tokens, prompts below, at and past it, each decoding
    past it; transformers' tokens (it recomputes its cache with the long factors there)."""
    path = tmp_path_factory.mktemp("phi3-switch")
    model = build_hf_model("phi3-long", path)
    rng = random.Random(6)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (20, 28, 31, 32, 10, 33, 45)]
    return path, prompts, hf_greedy(model, prompts, 24)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_longrope_sequences_growing_past_the_switch_like_transformers(
    longrope_checkpoint, config, async_scheduling
):
    """The long factors for every key of a sequence past the original length, whether it got
    there while decoding (recomputed at that step), in prefill chunks that end before it, or
    resumed after a preemption; the prefix cache never mixes the two rotations."""
    path, prompts, expected = longrope_checkpoint
    llm = LLM(str(path), skip_tokenizer_init=True, dtype=F32, max_num_seqs=8, max_model_len=256,
              async_scheduling=async_scheduling, **CONFIGS[config])
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    if config == "plain":
        # Short prompts first, then the long ones sharing their first blocks, and again.
        rng = random.Random(7)
        prefix = [rng.randrange(3, VOCAB) for _ in range(16)]
        pair = [prefix + [rng.randrange(3, VOCAB) for _ in range(n)] for n in (4, 30)]
        want = [hf_greedy(_hf_model(path), [p], 4)[0] for p in pair]
        for order in (pair, pair[::-1], pair):
            got = [llm.generate([{"prompt_token_ids": p}], SamplingParams(
                temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)[0]
                   .outputs[0].token_ids for p in order]
            assert got == (want if order[0] is pair[0] else want[::-1])


def _hf_model(path):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    return model.float().eval()

def test_cache_salt_isolates_the_prefix_cache():
    """vLLM's cache_salt: a prompt is served from cached blocks only to requests with the same
    salt (or, without one, to requests without one); the tokens never change."""
    from tests.tiny import tiny_args

    llm = LLM(**vars(tiny_args()))
    prompt = list(range(3, 3 + 40))  # two full blocks of 16 and a partial one
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

    def run(salt):
        p = {"prompt_token_ids": prompt} if salt is None else {"prompt_token_ids": prompt,
                                                              "cache_salt": salt}
        out = llm.generate([p], params, use_tqdm=False)[0]
        return out.num_cached_tokens, out.outputs[0].token_ids

    first = run("tenant-a")
    assert first[0] == 0
    assert run("tenant-a") == (32, first[1])  # the same salt: both full blocks
    assert run("tenant-b") == (0, first[1])
    assert run(None) == (0, first[1])
    assert run(None) == (32, first[1])
    with pytest.raises(ValueError, match="cache_salt"):
        run("")


def test_detokenize_false_gives_ids_only():
    """vLLM's detokenize=False: the same token ids, no text (logprobs' tokens undecoded); stop
    strings need text and are refused."""
    from tests.tiny import tiny_args

    llm = LLM(**vars(tiny_args()))
    base = dict(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)
    with_text = llm.generate(["the cat"], SamplingParams(**base), use_tqdm=False)[0].outputs[0]
    ids_only = llm.generate(["the cat"], SamplingParams(**base, detokenize=False),
                            use_tqdm=False)[0].outputs[0]
    assert ids_only.token_ids == with_text.token_ids and with_text.text
    assert ids_only.text == ""
    assert all(lp.decoded_token is None for row in ids_only.logprobs for lp in row.values())
    assert [sorted(r) for r in ids_only.logprobs] == [sorted(r) for r in with_text.logprobs]
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(stop=["x"], detokenize=False)
    assert SamplingParams(extra_args={"k": 1}).clone().extra_args == {"k": 1}


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_request_that_fills_the_kv_cache_exactly_runs_without_preemption(async_scheduling):
    """3 usable blocks of 16: 48 slots hold a 40-token prompt and 9 completion tokens (the
    last is sampled, never fed back); 10 completion tokens are refused naming max_tokens."""
    llm = LLM("tiny", num_gpu_blocks_override=4, block_size=16, max_model_len=128,
              async_scheduling=async_scheduling)
    try:
        prompt = {"prompt_token_ids": [5 + i % 50 for i in range(40)]}
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=9,
                                                    ignore_eos=True), use_tqdm=False)[0]
        assert len(out.outputs[0].token_ids) == 9
        assert llm.engine_core.scheduler.num_preemptions == 0
        with pytest.raises(ValueError, match="max_tokens") as info:
            llm.generate([prompt], SamplingParams(max_tokens=10), use_tqdm=False)
        assert "at most 9" in str(info.value)
        assert llm.engine_core.num_free_kv_blocks == llm.engine_core.num_kv_blocks - 1
    finally:
        llm.shutdown()


def test_reset_prefix_cache_forgets_every_cached_prompt():
    """vLLM's LLM.reset_prefix_cache / AsyncLLM.reset_prefix_cache: afterwards a prompt served
    from the cache before is computed again, to the same tokens."""
    import asyncio

    from cadence.engine.async_llm import AsyncLLM
    from tests.tiny import tiny_args

    prompt = {"prompt_token_ids": list(range(3, 3 + 40))}  # two full blocks of 16
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm = LLM(**vars(tiny_args()))
    try:
        def run():
            out = llm.generate([prompt], params, use_tqdm=False)[0]
            return out.num_cached_tokens, out.outputs[0].token_ids

        first = run()
        assert run() == (32, first[1])
        assert llm.reset_prefix_cache() is True
        assert run() == (0, first[1])
    finally:
        llm.shutdown()

    async def served() -> list[int]:
        engine = AsyncLLM(tiny_args())
        try:
            cached = []
            for reset in (False, False, True):
                if reset:
                    assert await engine.reset_prefix_cache() is True
                outs = [o async for o in engine.generate(prompt, params, f"r{len(cached)}")]
                cached.append(outs[-1].num_cached_tokens)
            return cached
        finally:
            engine.shutdown()

    assert asyncio.run(served()) == [0, 32, 0]
