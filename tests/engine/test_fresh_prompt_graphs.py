"""The graphs of a lone prompt from position 0 (dense prefill attention): which steps replay
them, what their attention is told, and that tokens stay those of the plain buckets.

On the CPU no backend attends densely, so the model's answer is patched to "from 32 tokens";
the torch reference backend then receives the same metadata a CUDA backend would, and its
tokens must not change (it ignores ``fresh_prompt``)."""

from __future__ import annotations

import pytest

from cadence import LLM, SamplingParams
from cadence.model.attention import TorchAttentionBackend
from cadence.model.decoder import CausalLM

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _ids(n: int, seed: int) -> list[int]:
    return [3 + (seed * 7919 + 31 * i) % 200 for i in range(n)]


@pytest.fixture
def seen(monkeypatch):
    """Every prefill pass's (tokens, fresh_prompt) as the attention backend sees it."""
    calls: list[tuple[int, bool]] = []
    forward = TorchAttentionBackend.forward

    def spy(self, q, k, v, kv_cache, metadata, *args, **kw):
        if not metadata.is_decode_only:
            calls.append((q.shape[0], metadata.fresh_prompt))
        return forward(self, q, k, v, kv_cache, metadata, *args, **kw)

    monkeypatch.setattr(TorchAttentionBackend, "forward", spy)
    return calls


def _llm(dense_from: int | None, monkeypatch, **kw) -> LLM:
    monkeypatch.setattr(CausalLM, "dense_prefill_min_tokens",
                        lambda self, dtype, cache_dtype, device: dense_from)
    kw.setdefault("max_capture_tokens", 64)
    return LLM("tiny", device="cpu", max_model_len=256, max_num_seqs=4, emulate_graphs=True,
               async_scheduling=False, **kw)


def _layer_passes(calls: list[tuple[int, bool]]) -> list[tuple[int, bool]]:
    """One entry per forward (the tiny model's 4 layers see the same pass)."""
    assert len(calls) % 4 == 0
    passes = calls[::4]
    assert all(calls[i] == passes[i // 4] for i in range(len(calls)))
    return passes


def test_fresh_graphs_cover_the_mixed_sizes_from_the_dense_minimum(monkeypatch) -> None:
    llm = _llm(32, monkeypatch)
    runner = llm.engine_core.runner
    assert runner.fresh_graphs is not None
    assert runner.fresh_graphs.sizes == [s for s in runner.mixed_graphs.sizes if s >= 32]
    llm.shutdown()
    llm = _llm(None, monkeypatch)
    assert llm.engine_core.runner.fresh_graphs is None
    llm.shutdown()


def test_which_steps_are_told_fresh_prompt(monkeypatch, seen) -> None:
    llm = _llm(32, monkeypatch, enable_prefix_caching=True)
    runner = llm.engine_core.runner
    seen.clear()
    # 45 tokens pad to the 48-token bucket: 48^2 <= 1.15 * 45^2, the fresh graph.
    a = llm.generate([{"prompt_token_ids": _ids(45, 1)}], GREEDY, use_tqdm=False)
    assert _layer_passes(seen) == [(48, True)]
    assert runner.fresh_graphs.num_replays == 1
    # 40 tokens in the same bucket: too much padding for dense attention, the plain graph.
    seen.clear()
    llm.generate([{"prompt_token_ids": _ids(40, 2)}], GREEDY, use_tqdm=False)
    assert _layer_passes(seen) == [(48, False)]
    # The same 45-token prompt again: its first 32 tokens come from the prefix cache, so the
    # pass has context and is not fresh.
    seen.clear()
    b = llm.generate([{"prompt_token_ids": _ids(45, 1)}], GREEDY, use_tqdm=False)
    assert _layer_passes(seen) == [(16, False)]
    assert b[0].outputs[0].token_ids == a[0].outputs[0].token_ids
    # Two prompts in one step: not one sequence.
    seen.clear()
    llm.generate([{"prompt_token_ids": _ids(30, 3)}, {"prompt_token_ids": _ids(30, 4)}],
                 GREEDY, use_tqdm=False)
    assert _layer_passes(seen)[0] == (64, False)
    # Past the largest bucket (64): an eager pass of exactly the prompt, not told fresh (cuDNN
    # would plan every new length; dense attention is for the fresh graphs' shapes).
    seen.clear()
    llm.generate([{"prompt_token_ids": _ids(70, 5)}], GREEDY, use_tqdm=False)
    assert _layer_passes(seen) == [(70, False)]
    assert runner.fresh_graphs.num_replays == 1
    llm.shutdown()


def test_chunks_after_the_first_are_not_fresh(monkeypatch, seen) -> None:
    llm = _llm(16, monkeypatch, max_num_batched_tokens=32, max_capture_tokens=32)
    seen.clear()
    llm.generate([{"prompt_token_ids": _ids(80, 6)}], GREEDY, use_tqdm=False)
    assert _layer_passes(seen) == [(32, True), (32, False), (16, False)]
    llm.shutdown()


def test_tokens_equal_the_plain_buckets(monkeypatch) -> None:
    prompts = [{"prompt_token_ids": _ids(n, n)} for n in (45, 60, 70, 20)]
    outs = {}
    for dense_from in (None, 32):
        llm = _llm(dense_from, monkeypatch)
        # One at a time: each is a lone fresh prompt.
        outs[dense_from] = [llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
                            for p in prompts]
        if dense_from:
            assert llm.engine_core.runner.fresh_graphs.num_replays == 2  # 45 and 60 tokens
        assert llm.engine_core.num_free_kv_blocks == llm.engine_core.num_kv_blocks - 1
        llm.shutdown()
    assert outs[32] == outs[None]
