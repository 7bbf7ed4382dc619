"""Async scheduling on == off, token for token, with everything in the mix: chunked prefill,
preemption, prefix-cache hits, stop strings, stop tokens, min_tokens and seeded sampling."""

from __future__ import annotations

import pytest

from cadence import LLM, SamplingParams

PROMPTS = [
    "The quick brown fox",
    "Once upon a time, in a land far away,",
    "Hello, my name is",
    "The quick brown fox jumps over",  # shares a prefix with the first
    "A very long prompt that keeps going " * 4,
    "Numbers: 1 2 3 4 5 6 7 8 9 10",
]


def _run(async_scheduling: bool, params: list[SamplingParams], **kw):
    llm = LLM("tiny", device="cpu", max_model_len=256, max_num_seqs=4,
              async_scheduling=async_scheduling, **kw)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    stats = llm.engine_core.make_stats()
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason,
             o.outputs[0].stop_reason, o.outputs[0].logprobs) for o in outs], stats


def _without_logprob_values(outs):
    """The outputs with each logprob's value left out (token ids, ranks and text kept)."""
    return [(*o[:4], None if o[4] is None else
             [{t: (lp.rank, lp.decoded_token) for t, lp in row.items()} for row in o[4]])
            for o in outs]


def _logprob_values(outs) -> list[float]:
    return [lp.logprob for o in outs for row in o[4] or [] for lp in row.values()]


@pytest.fixture(scope="module")
def reference():
    """Plain greedy continuations, used to pick stop strings and stop tokens that do occur."""
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    outs, _ = _run(False, [params] * len(PROMPTS))
    return outs


def _mixed_params(reference) -> list[SamplingParams]:
    text0, ids1 = reference[0][1], reference[1][0]
    return [
        # A stop string taken from the middle of the greedy text: it must end the request.
        SamplingParams(temperature=0.0, max_tokens=40, stop=[text0[12:15]]),
        # A stop token that greedy decoding produces at output 10 (EOS-like stop).
        SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[ids1[10]]),
        SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=30),
        SamplingParams(temperature=0.7, top_k=20, seed=5, max_tokens=35, min_tokens=30),
        SamplingParams(temperature=0.0, max_tokens=33, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=2, max_tokens=25, logprobs=2, ignore_eos=True),
    ]


CONFIGS = {
    "chunked": dict(max_num_batched_tokens=24),
    "preempt": dict(num_gpu_blocks_override=9, max_num_batched_tokens=64),
    "plain": dict(),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_async_on_equals_off(reference, config):
    params = _mixed_params(reference)
    off, _ = _run(False, params, **CONFIGS[config])
    on, stats = _run(True, params, **CONFIGS[config])
    assert _without_logprob_values(on) == _without_logprob_values(off)
    # Batches of other sizes round the logits differently: equal values within float32 noise.
    assert _logprob_values(on) == pytest.approx(_logprob_values(off), abs=1e-4)
    # The stop string and the stop token really ended their requests early.
    assert off[0][2] == "stop" and off[0][3] == _mixed_params(reference)[0].stop[0]
    assert off[1][2] == "stop" and off[1][3] == reference[1][0][10]
    assert len(off[1][0]) <= 11
    assert len(off[3][0]) >= 30  # min_tokens held
    # The request asking for 2 logprobs (compared above too) has them for every token: the top
    # 2 (ranks 1 and 2) and the sampled one, a third entry when it ranks lower.
    logprobs = off[5][4]
    assert logprobs is not None and len(logprobs) == len(off[5][0]) == 25
    for token, row in zip(off[5][0], logprobs, strict=True):
        ranks = {lp.rank: lp.logprob for lp in row.values()}
        assert token in row and len(row) == 2 + (row[token].rank > 2)
        assert 0 >= ranks[1] >= ranks[2] and ranks[row[token].rank] == row[token].logprob
        assert row[token].rank <= 2 or ranks[2] >= row[token].logprob
    assert all(o[4] is None for i, o in enumerate(off) if i != 5)
    if config == "preempt":
        assert stats.num_preemptions > 0
