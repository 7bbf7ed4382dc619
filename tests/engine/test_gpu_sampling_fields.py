"""GPU: penalties, logit bias, allowed ids, min_p, bad words, prompt logprobs and n > 1 with
CUDA graphs equal eager, and the repetition penalty equals transformers (run with -m gpu)."""

from __future__ import annotations

import gc
import random

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def _llm(**kw):
    from cadence import LLM

    kw.setdefault("num_gpu_blocks_override", 1024)
    return LLM(device="cuda", **kw)


def _free(llm) -> None:
    llm.engine_core.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()


def _mixed_params(n_prompts: int):
    from cadence import SamplingParams

    kinds = [dict(repetition_penalty=1.6), dict(frequency_penalty=1.2, presence_penalty=0.4),
             dict(logit_bias={7: 4.0, 9: -30.0}), dict(allowed_token_ids=list(range(3, 300, 5))),
             dict(min_p=0.2, temperature=0.9), dict()]
    out = []
    for i in range(n_prompts):
        # The rows with n = 2 sample (greedy n > 1 is refused, as vLLM refuses it).
        kw = {"temperature": 0.8 if i % 3 == 0 else 0.0, **kinds[i % len(kinds)]}
        out.append(SamplingParams(max_tokens=32, ignore_eos=True, seed=i, prompt_logprobs=2,
                                  n=2 if i % 3 == 0 else 1, **kw))
    return out


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_processors_graphs_equal_eager_float32(async_scheduling):
    rng = random.Random(5)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 600) for _ in range(rng.randrange(4, 60))]}
               for _ in range(24)]
    params = _mixed_params(len(prompts))
    results = {}
    for eager in (True, False):
        llm = _llm(model="tiny", dtype="float32", enforce_eager=eager, max_num_seqs=32,
                   max_num_batched_tokens=128, async_scheduling=async_scheduling)
        outs = llm.generate(prompts, params, use_tqdm=False)
        results[eager] = outs
        _free(llm)
    for a, b in zip(results[True], results[False], strict=True):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
        assert len(a.prompt_logprobs) == len(b.prompt_logprobs)
        for ra, rb in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
            tok = next(iter(ra))  # the prompt token comes first
            assert ra[tok].logprob == pytest.approx(rb[tok].logprob, abs=1e-3)


def test_repetition_penalty_matches_transformers_on_gpu(tmp_path):
    from cadence import SamplingParams
    from tests.hf_models import VOCAB, build_hf_model

    model = build_hf_model("qwen3", tmp_path)
    rng = random.Random(2)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (5, 20, 41)]
    expected = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=24, min_new_tokens=24, repetition_penalty=1.5,
                                 eos_token_id=None, pad_token_id=0)
        expected.append(gen[0, len(p):].tolist())
    llm = _llm(model=str(tmp_path), dtype="float32", skip_tokenizer_init=True, max_model_len=256,
               max_num_seqs=8)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                            repetition_penalty=1.5)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    _free(llm)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_structured_outputs_with_graphs(async_scheduling):
    """Grammar rows under CUDA graphs: valid outputs, the same as eager, next to free rows."""
    import re

    from cadence import SamplingParams
    from cadence.sampling_params import StructuredOutputsParams

    regex = r"[a-c]{2,4}-[0-9]{3}"
    params = []
    for i in range(24):
        spec = (StructuredOutputsParams(regex=regex) if i % 3 == 0 else
                StructuredOutputsParams(choice=["yes", "no", "maybe"]) if i % 3 == 1 else None)
        params.append(SamplingParams(temperature=1.0, seed=i, max_tokens=24,
                                     structured_outputs=spec))
    results = {}
    for eager in (True, False):
        llm = _llm(model="tiny", dtype="float32", enforce_eager=eager, max_num_seqs=32,
                   async_scheduling=async_scheduling)
        outs = llm.generate(["Answer:"] * len(params), params, use_tqdm=False)
        results[eager] = [o.outputs[0].token_ids for o in outs]
        for i, o in enumerate(outs):
            text = o.outputs[0].text
            if i % 3 == 0:
                assert re.fullmatch(regex, text), text
            elif i % 3 == 1:
                assert text in ("yes", "no", "maybe"), text
        _free(llm)
    assert results[True] == results[False]


def test_prompt_logprobs_of_chunks_that_sample_nothing():
    """A long prompt in chunks (steps where no request samples) scores the same as in one."""
    from cadence import SamplingParams

    rng = random.Random(9)
    prompt = {"prompt_token_ids": [rng.randrange(3, 600) for _ in range(150)]}
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1)
    got = []
    for chunk in (32, 4096):
        llm = _llm(model="tiny", dtype="float32", max_num_batched_tokens=chunk, max_num_seqs=4)
        got.append(llm.generate([prompt], params, use_tqdm=False)[0].prompt_logprobs)
        _free(llm)
    assert len(got[0]) == len(got[1]) == 150
    for a, b in zip(got[0][1:], got[1][1:]):
        tok = next(iter(a))
        assert a[tok].logprob == pytest.approx(b[tok].logprob, abs=1e-4)
