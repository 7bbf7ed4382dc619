"""repetition_detection through the engine: the tiny model's greedy output is cut at the first
token where the rule (tests/test_repetition.py's ``first_detection``) holds, with finish reason
"repetition" and stop reason "repetition_detected", whether scheduled ahead or not; min_tokens
defers it; outputs that never repeat run on."""

from __future__ import annotations

import pytest

from cadence.engine.llm import LLM
from cadence.sampling_params import SamplingParams
from tests.test_repetition import first_detection, repeats

PROMPTS = [[5, 6, 7, 8, 9, 10], [40, 41, 42], [100 + i for i in range(30)], [7] * 20]
GREEDY = dict(temperature=0.0, max_tokens=80, ignore_eos=True)


@pytest.fixture(scope="module", params=[True, False], ids=["async", "sync"])
def llm(request: pytest.FixtureRequest) -> LLM:
    return LLM(model="tiny", async_scheduling=request.param)


def _run(llm: LLM, **params: object) -> list:
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(**{**GREEDY, **params}), use_tqdm=False)
    return [o.outputs[0] for o in outs]


@pytest.mark.parametrize(("low", "high", "count"), [(0, 8, 3), (2, 5, 2), (1, 1, 4)])
def test_output_stops_where_it_first_repeats(llm: LLM, low: int, high: int, count: int) -> None:
    free = _run(llm)
    cut = _run(llm, repetition_detection={"max_pattern_size": high, "min_pattern_size": low,
                                          "min_count": count})
    stopped = 0
    for whole, got in zip(free, cut, strict=True):
        end = first_detection(list(whole.token_ids), low, high, count)
        if end is None:
            assert got.token_ids == whole.token_ids and got.finish_reason == "length"
            continue
        assert list(got.token_ids) == list(whole.token_ids[:end])
        if end == GREEDY["max_tokens"]:  # max_tokens is checked first, as in vLLM
            assert got.finish_reason == "length"
            continue
        stopped += 1
        assert got.finish_reason == "repetition" and got.stop_reason == "repetition_detected"
        assert got.text == llm.get_tokenizer().decode(got.token_ids)
    assert stopped > 0  # the random model does loop


def test_min_tokens_defers_the_check(llm: LLM) -> None:
    rd = {"max_pattern_size": 8, "min_count": 3}
    (first,) = _run(llm, repetition_detection=rd)[:1]
    early = len(first.token_ids)
    assert first.finish_reason == "repetition"
    (later,) = _run(llm, repetition_detection=rd, min_tokens=early + 5)[:1]
    whole = _run(llm)[0].token_ids
    # Checked first at min_tokens: the first end from there on where the tail repeats.
    want = next(end for end in range(early + 5, len(whole) + 1)
                if repeats(list(whole[:end]), 0, 8, 3))
    assert list(later.token_ids) == list(whole[:want])

