"""Which steps run their last layer for each row's last token only (``OutputRows``): eager
prefill steps where every row samples and none scores prompt tokens, and the fresh graphs of a
lone prompt; the tokens and prompt logprobs stay those of whole passes."""

from __future__ import annotations

import pytest

from cadence import LLM, SamplingParams
from cadence.model.decoder import CausalLM

GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
SCORED = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=2)


def _ids(n: int, seed: int) -> list[int]:
    return [3 + (seed * 7919 + 31 * i) % 200 for i in range(n)]


def _prompts(*lengths: int) -> list[dict]:
    return [{"prompt_token_ids": _ids(n, i + n)} for i, n in enumerate(lengths)]


def _mlp_rows(llm: LLM) -> list[int]:
    """Rows of each call of the last layer's gate_up projection (one call per step)."""
    seen: list[int] = []
    proj = llm.engine_core.runner.model.model.layers[-1].mlp.gate_up_proj
    proj.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[0]))
    return seen


def _eager(monkeypatch, rows: bool, **kw) -> LLM:
    if not rows:
        monkeypatch.setenv("CADENCE_DISABLE_OUTPUT_ROWS", "1")
    llm = LLM("tiny", device="cpu", max_model_len=256, max_num_seqs=4, enforce_eager=True,
              async_scheduling=False, **kw)
    monkeypatch.delenv("CADENCE_DISABLE_OUTPUT_ROWS", raising=False)
    return llm


def _tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def _logprobs(outs) -> list:
    return [[None if p is None else {t: round(lp.logprob, 4) for t, lp in p.items()}
             for p in o.prompt_logprobs] for o in outs]


def test_an_eager_prefill_runs_its_last_layer_for_the_sampled_rows(monkeypatch) -> None:
    prompts = _prompts(17, 40, 9)
    got = {}
    for rows in (True, False):
        llm = _eager(monkeypatch, rows)
        seen = _mlp_rows(llm)
        got[rows] = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
        # The prefill step: 3 rows with rows on, its 66 tokens without; then 4 decode steps.
        assert seen == ([3] if rows else [66]) + [3] * 4
        llm.shutdown()
    assert got[True] == got[False]


def test_a_step_with_a_row_that_samples_nothing_runs_every_token(monkeypatch) -> None:
    # A 24-token budget: the 40-token prompt is cut, its first chunk samples nothing.
    llm = _eager(monkeypatch, True, max_num_batched_tokens=24)
    seen = _mlp_rows(llm)
    outs = llm.generate(_prompts(40), GREEDY, use_tqdm=False)
    assert seen[:2] == [24, 1]  # the cut chunk whole; the last chunk's sampled row alone
    llm.shutdown()
    plain = _eager(monkeypatch, False, max_num_batched_tokens=24)
    assert _tokens(plain.generate(_prompts(40), GREEDY, use_tqdm=False)) == _tokens(outs)
    plain.shutdown()


def test_a_step_that_scores_prompt_tokens_runs_every_token(monkeypatch) -> None:
    prompts = _prompts(12, 20)
    got = {}
    for rows in (True, False):
        llm = _eager(monkeypatch, rows)
        seen = _mlp_rows(llm)
        outs = llm.generate(prompts, [GREEDY, SCORED], use_tqdm=False)
        assert seen[0] == 32
        got[rows] = (_tokens(outs), _logprobs(outs[1:]))
        llm.shutdown()
    assert got[True] == got[False]


def _fresh(monkeypatch, rows: bool) -> LLM:
    monkeypatch.setattr(CausalLM, "dense_prefill_min_tokens",
                        lambda self, dtype, cache_dtype, device: 32)
    if not rows:
        monkeypatch.setenv("CADENCE_DISABLE_OUTPUT_ROWS", "1")
    llm = LLM("tiny", device="cpu", max_model_len=256, max_num_seqs=4, emulate_graphs=True,
              max_capture_tokens=64, async_scheduling=False)
    monkeypatch.delenv("CADENCE_DISABLE_OUTPUT_ROWS", raising=False)
    return llm


@pytest.mark.parametrize("rows", [True, False])
def test_a_fresh_graph_returns_its_prompts_last_token(monkeypatch, rows: bool) -> None:
    llm = _fresh(monkeypatch, rows)
    runner = llm.engine_core.runner
    shapes: list[int] = []
    replay = runner.fresh_graphs.replay

    def spy(size: int):
        hidden = replay(size)
        shapes.append(hidden.shape[0])
        return hidden

    monkeypatch.setattr(runner.fresh_graphs, "replay", spy)
    seen = _mlp_rows(llm)
    llm.generate(_prompts(45), GREEDY, use_tqdm=False)
    assert runner.fresh_graphs.num_replays >= 1
    assert shapes[0] == (1 if rows else 48) and seen[0] == (1 if rows else 48)
    llm.shutdown()


def test_a_fresh_prompt_whose_tokens_are_scored_takes_the_plain_graph(monkeypatch) -> None:
    got = {}
    for rows in (True, False):
        llm = _fresh(monkeypatch, rows)
        runner = llm.engine_core.runner
        outs = llm.generate(_prompts(45), SCORED, use_tqdm=False)
        # With rows on, the fresh graph has no state of the prompt's other tokens to score.
        assert runner.fresh_graphs.num_replays == (0 if rows else 1)
        got[rows] = (_tokens(outs), _logprobs(outs))
        llm.shutdown()
    assert got[True] == got[False]
