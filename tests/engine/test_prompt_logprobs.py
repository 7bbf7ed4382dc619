"""prompt_logprobs against transformers' log-softmax over the prompt, in every engine
configuration (chunked prefill splits the prompt; prefix-cache hits must not skip positions)."""

from __future__ import annotations

import random

import pytest
import torch

from cadence import LLM, SamplingParams
from tests.hf_models import VOCAB, build_hf_model

CONFIGS = {
    "plain": dict(),
    "chunked": dict(max_num_batched_tokens=16),
    "preempt": dict(num_gpu_blocks_override=8, max_num_batched_tokens=64),
}
K = 3


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    model = build_hf_model("llama", path)
    rng = random.Random(4)
    prefix = [rng.randrange(3, VOCAB) for _ in range(32)]
    prompts = [prefix + [rng.randrange(3, VOCAB) for _ in range(n)] for n in (1, 9, 30)]
    expected = []
    with torch.no_grad():
        for p in prompts:
            lp = torch.log_softmax(model(torch.tensor([p])).logits[0].float(), dim=-1)
            expected.append(lp)
    return path, prompts, expected


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_prompt_logprobs_match_transformers(hf, config, async_scheduling):
    path, prompts, expected = hf
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="float32", max_num_seqs=4, max_model_len=256,
              async_scheduling=async_scheduling, **CONFIGS[config])
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, prompt_logprobs=K)
    for _ in range(2):  # the second round would hit the prefix cache
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        for prompt, lp, out in zip(prompts, expected, outs):
            got = out.prompt_logprobs
            assert got is not None and len(got) == len(prompt) and got[0] is None
            for i in range(1, len(prompt)):
                row, want = got[i], lp[i - 1]
                tok = prompt[i]
                assert tok in row
                assert row[tok].logprob == pytest.approx(float(want[tok]), abs=1e-4)
                assert row[tok].rank == int((want >= want[tok]).sum())  # vLLM's rank
                top = set(want.topk(K).indices.tolist())
                assert top <= set(row) and len(set(row) - top) <= 1
        if config == "preempt":
            assert llm.engine_core.make_stats().num_preemptions > 0


def test_prompt_logprobs_with_sample_logprobs_and_delta_outputs(hf):
    """Both kinds at once, and the streaming API: the first output carries the prompt's."""
    import asyncio

    from cadence.engine.async_llm import AsyncLLM
    from cadence.engine.engine_args import EngineArgs
    from cadence.sampling_params import RequestOutputKind

    path, prompts, expected = hf

    async def run():
        engine = AsyncLLM(EngineArgs(model=str(path), skip_tokenizer_init=True, dtype="float32",
                                     max_model_len=256, max_num_batched_tokens=16))
        try:
            params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=2,
                                    prompt_logprobs=0, output_kind=RequestOutputKind.DELTA)
            delta = [o async for o in engine.generate({"prompt_token_ids": prompts[2]}, params,
                                                      request_id="r")]
            params.output_kind = RequestOutputKind.CUMULATIVE
            whole = [o async for o in engine.generate({"prompt_token_ids": prompts[2]}, params,
                                                      request_id="c")]
            return delta, whole
        finally:
            engine.shutdown()

    outs, cumulative = asyncio.run(run())
    first = outs[0].prompt_logprobs
    assert first is not None and len(first) == len(prompts[2])
    assert all(o.prompt_logprobs == [] for o in outs[1:])  # as vLLM's pop leaves them
    # Cumulative outputs are whole: every one carries the prompt's, the last one too. (How many
    # there are depends on how fast this consumer reads; test_output_processor checks each.)
    assert cumulative
    assert all(o.prompt_logprobs is not None and len(o.prompt_logprobs) == len(prompts[2])
               for o in cumulative)
    tok = prompts[2][5]
    assert first[5][tok].logprob == pytest.approx(float(expected[2][4][tok]), abs=1e-4)
    assert all(len(o.outputs[0].logprobs or []) == len(o.outputs[0].token_ids) for o in outs)
