"""vLLM's flat_logprobs: the same logprobs as the list of dicts, as a FlatLogprobs, for sample
and prompt logprobs, whole and streamed (DELTA outputs merged), with n > 1."""

from __future__ import annotations

import asyncio

import pytest

from cadence import LLM, SamplingParams
from cadence.outputs import FlatLogprobs
from cadence.sampling_params import RequestOutputKind
from tests.tiny import tiny_args

PROMPTS = [{"prompt_token_ids": [72, 101, 278, 111, 295, 121]},
           {"prompt_token_ids": [5, 17, 33, 99]}]


@pytest.fixture(scope="module")
def llm():
    engine = LLM(**vars(tiny_args()))
    yield engine
    engine.shutdown()


def _params(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=7, ignore_eos=True, logprobs=3, prompt_logprobs=2,
                          seed=4, temperature=0.9, n=2, **kw)


def test_flat_logprobs_equal_the_list_form(llm) -> None:
    lists = llm.generate(PROMPTS, _params(), use_tqdm=False)
    flats = llm.generate(PROMPTS, _params(flat_logprobs=True), use_tqdm=False)
    for a, b in zip(lists, flats):
        assert isinstance(b.prompt_logprobs, FlatLogprobs)
        assert a.prompt_logprobs[0] is None and b.prompt_logprobs[0] == {}
        assert list(b.prompt_logprobs)[1:] == a.prompt_logprobs[1:]
        for ca, cb in zip(a.outputs, b.outputs):
            assert isinstance(cb.logprobs, FlatLogprobs)
            assert cb.token_ids == ca.token_ids and list(cb.logprobs) == ca.logprobs
            assert cb.cumulative_logprob == ca.cumulative_logprob


def test_streamed_flat_logprobs_merge_to_the_whole(llm) -> None:
    from cadence.engine.async_llm import AsyncLLM

    whole = llm.generate(PROMPTS[0], _params(), use_tqdm=False)[0]

    async def run() -> dict[int, list]:
        engine = AsyncLLM.from_engine_args(tiny_args())
        got: dict[int, FlatLogprobs] = {}
        try:
            params = _params(flat_logprobs=True, output_kind=RequestOutputKind.DELTA)
            async for out in engine.generate(PROMPTS[0], params, "r"):
                for c in out.outputs:
                    assert c.logprobs is None or isinstance(c.logprobs, FlatLogprobs)
                    if c.logprobs:
                        got.setdefault(c.index, FlatLogprobs()).extend(c.logprobs)
        finally:
            engine.shutdown()
        return {i: list(f) for i, f in got.items()}

    got = asyncio.run(run())
    assert got == {c.index: c.logprobs for c in whole.outputs}


def test_merged_delta_outputs_stay_flat() -> None:
    from cadence.outputs import CompletionOutput, Logprob, RequestOutput

    def out(tokens: list[int]) -> RequestOutput:
        flat = FlatLogprobs()
        flat.extend({t: Logprob(-1.0 * t, 1, None)} for t in tokens)
        return RequestOutput("r", None, [1], None, [CompletionOutput(0, "", tokens, None,
                                                                     flat)], False)

    first = out([3, 4])
    first.add(out([5]), aggregate=True)
    merged = first.outputs[0].logprobs
    assert isinstance(merged, FlatLogprobs) and [list(r) for r in merged] == [[3], [4], [5]]
