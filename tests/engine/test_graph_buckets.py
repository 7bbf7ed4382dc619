"""Steps that replay a graph bucket (decode by batch size, mixed prefill/decode by token count)
give the same tokens as plain eager steps. On the CPU the buckets are emulated: the same
padding of tokens and rows into the same static buffers, re-run eagerly at every "replay"."""

from __future__ import annotations

import pytest

from cadence import LLM, SamplingParams

PROMPTS = [
    "The quick brown fox",
    "Once upon a time, in a land far away, there lived",
    "Hello, my name is",
    "The quick brown fox jumps over",  # shares a prefix with the first
    "A very long prompt that keeps going " * 3,
    "Numbers: 1 2 3 4 5 6 7 8 9 10",
    "x",
]

PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=20, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=2),
    SamplingParams(temperature=0.7, top_k=12, seed=9, max_tokens=26, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=18, ignore_eos=True),
    SamplingParams(temperature=1.0, seed=1, max_tokens=22, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
]

CONFIGS = {
    # Chunks of 40 tokens next to decodes: most steps are mixed and replay a token bucket.
    "chunked": dict(max_num_batched_tokens=40, max_capture_tokens=40),
    # Few KV blocks: preemption and re-prefill of preempted requests.
    "preempt": dict(num_gpu_blocks_override=10, max_num_batched_tokens=64,
                    max_capture_tokens=48),
    # Some mixed steps exceed the largest bucket (32) and run eagerly beside bucketed ones.
    "partial": dict(max_num_batched_tokens=96, max_capture_tokens=32),
    # A budget of max_num_seqs tokens: prompts advance a token at a time beside decodes, so
    # some steps have one token per row yet a row that does not sample (a mid-prompt chunk):
    # not a decode step.
    "one-token-chunks": dict(max_num_batched_tokens=4, max_capture_tokens=4),
}


def _run(graphs: bool, async_scheduling: bool, **kw):
    llm = LLM("tiny", device="cpu", max_model_len=192, max_num_seqs=4,
              async_scheduling=async_scheduling, emulate_graphs=graphs,
              enforce_eager=not graphs, **kw)
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    runner = llm.engine_core.runner
    replays = (runner.graphs.num_replays if runner.graphs else 0,
               runner.mixed_graphs.num_replays if runner.mixed_graphs else 0)
    stats = llm.engine_core.make_stats()
    free = llm.engine_core.num_free_kv_blocks
    llm.shutdown()
    tokens = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs]
    logprobs = [o.outputs[0].logprobs for o in outs]
    return tokens, logprobs, replays, stats, free


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_graph_buckets_equal_eager(config: str, async_scheduling: bool) -> None:
    kw = CONFIGS[config]
    eager, eager_lps, _, _, _ = _run(False, async_scheduling, **kw)
    graphed, graphed_lps, (decode_replays, mixed_replays), stats, free = _run(
        True, async_scheduling, **kw
    )
    assert graphed == eager
    for got, want in zip(graphed_lps, eager_lps, strict=True):
        if want is not None:
            # Same candidates and ranks; values to float32 rounding (padding changes GEMM shapes).
            assert [{t: lp.rank for t, lp in r.items()} for r in got] == [
                {t: lp.rank for t, lp in r.items()} for r in want
            ]
            flat_got = [lp.logprob for r in got for lp in r.values()]
            flat_want = [lp.logprob for r in want for lp in r.values()]
            assert flat_got == pytest.approx(flat_want, rel=1e-4, abs=1e-5)
    # Mixed graphs start at 16 tokens: a 4-token budget has none.
    assert decode_replays > 0 and (mixed_replays > 0) == (config != "one-token-chunks")
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
    if config == "preempt":
        assert stats.num_preemptions > 0
    assert stats.kv_cache_usage == 0.0 and free > 0


def test_enforce_eager_and_zero_capture_tokens_capture_no_mixed_graphs() -> None:
    llm = LLM("tiny", device="cpu", max_model_len=64, max_num_seqs=2, emulate_graphs=True,
              max_capture_tokens=0)
    runner = llm.engine_core.runner
    assert runner.graphs is not None and runner.mixed_graphs is None
    llm.shutdown()
    llm = LLM("tiny", device="cpu", max_model_len=64, max_num_seqs=2, emulate_graphs=True,
              enforce_eager=True)
    runner = llm.engine_core.runner
    assert runner.graphs is None and runner.mixed_graphs is None
    llm.shutdown()
