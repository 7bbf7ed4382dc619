"""GrammarState's masks: the same rows and bits whether one thread or xgrammar's pool fills
them; terminated grammars leave their rows free."""

from __future__ import annotations

import pytest
import torch

from cadence.sampling_params import SamplingParams, StructuredOutputsParams
from cadence.worker import grammar as grammar_mod
from cadence.worker.grammar import GrammarState

pytest.importorskip("xgrammar")


def _masks(threshold: float, monkeypatch) -> list[tuple[list[int], torch.Tensor]]:
    from cadence.model.tiny import ensure_tiny_model

    monkeypatch.setattr(grammar_mod, "_THREADED_FILL_S", threshold)
    state = GrammarState(str(ensure_tiny_model()), vocab_size=700, max_rows=8)
    specs = [dict(choice=["ab", "cd"]), dict(regex="[0-9]+"), dict(json_object=True)]
    ids = [f"r{i}" for i in range(6)]
    for i, rid in enumerate(ids):
        spec = StructuredOutputsParams(**specs[i % 3])
        state.admit(rid, SamplingParams(structured_outputs=spec), [])
    out = []
    for _ in range(3):  # the estimate settles after the first fill
        mask = state.bitmask(["free", *ids], [0] * 7, dict)
        assert mask is not None
        out.append((mask.rows.tolist(), mask.words.clone()))
    state.close()
    return out


def test_threaded_and_single_fills_agree(monkeypatch) -> None:
    single = _masks(1.0, monkeypatch)
    threaded = _masks(0.0, monkeypatch)
    for (rows_a, words_a), (rows_b, words_b) in zip(single, threaded, strict=True):
        assert rows_a == rows_b == [1, 2, 3, 4, 5, 6]  # row 0 has no grammar
        assert torch.equal(words_a, words_b)
    # Rows under different grammars allow different tokens.
    assert not torch.equal(single[0][1][0], single[0][1][1])


@pytest.fixture(scope="module")
def tiny_path() -> str:
    from cadence.model.tiny import ensure_tiny_model

    return str(ensure_tiny_model())


def _ids() -> dict[str, int]:
    from cadence.model.tiny import EOS_TOKEN, build_tokenizer

    tok = build_tokenizer()
    return {s: tok.token_to_id(s) for s in ("a", "b", "c", "d", "x", EOS_TOKEN)}


def _allowed(mask, i: int) -> set[int]:
    """The token ids row ``i`` of ``mask`` allows (bit t % 32 of word t // 32)."""
    words = mask.words[i].tolist()
    return {32 * w + b for w, word in enumerate(words) for b in range(32) if (word >> b) & 1}


def _ab_or_cd(path: str) -> tuple[GrammarState, SamplingParams]:
    state = GrammarState(path, vocab_size=640, max_rows=4)
    return state, SamplingParams(structured_outputs=StructuredOutputsParams(choice=["ab", "cd"]))


def test_in_flight_token_advances_the_matcher(tiny_path) -> None:
    """Under async scheduling the previous step's token, still unknown to the host's history,
    is read from in_flight() and consumed before the mask is filled."""
    ids = _ids()
    state, params = _ab_or_cd(tiny_path)
    state.admit("r", params, [])
    first = state.bitmask(["r"], [0], dict)
    assert first is not None and {ids["a"], ids["c"]} <= _allowed(first, 0)
    assert ids["b"] not in _allowed(first, 0)
    second = state.bitmask(["r"], [1], lambda: {"r": ids["a"]})
    assert second is not None and _allowed(second, 0) == {ids["b"]}
    state.close()


def test_a_token_recorded_twice_is_consumed_once(tiny_path) -> None:
    ids = _ids()
    state, params = _ab_or_cd(tiny_path)
    state.admit("r", params, [])
    admission = state.wants("r")
    state.record("r", 0, ids["a"], admission)
    state.record("r", 0, ids["a"], admission)  # the same output again (index 0): ignored
    state.record("r", 1, ids["b"], admission)
    state.record("r", 2, ids["x"], object())  # another admission's token: not this one's
    mask = state.bitmask(["r"], [2], dict)
    assert state.take_failed() == {}
    assert mask is not None and _allowed(mask, 0) == {ids["<|endoftext|>"]}
    state.close()


def test_tokens_sampled_past_the_grammars_end_are_dropped(tiny_path) -> None:
    """After the stop token a step scheduled ahead may sample one more token: it neither fails
    the request nor gets a mask row (its grammar is done)."""
    ids = _ids()
    state, params = _ab_or_cd(tiny_path)
    state.admit("r", params, [ids["a"], ids["b"], ids["<|endoftext|>"], ids["x"]])
    assert state.bitmask(["free", "r"], [0, 4], dict) is None
    assert state.take_failed() == {} and state.wants("r")
    state.close()


def test_a_token_outside_the_grammar_fails_the_request_once(tiny_path) -> None:
    ids = _ids()
    state, params = _ab_or_cd(tiny_path)
    state.admit("r", params, [ids["a"], ids["d"]])
    assert "grammar" in state.take_failed()["r"]
    assert not state.wants("r")
    assert state.bitmask(["r"], [3], lambda: {"r": ids["x"]}) is None
    assert state.take_failed() == {}
    state.close()


def test_no_token_ends_the_constraint(tiny_path) -> None:
    ids = _ids()
    state, params = _ab_or_cd(tiny_path)
    state.admit("r", params, [])
    state.admit("s", params, [ids["a"]])
    state.record("r", 0, -1, state.wants("r"))  # NO_TOKEN: the row's masks left nothing; the request fails
    assert not state.wants("r") and state.wants("s")
    mask = state.bitmask(["r", "s"], [1, 1], dict)
    assert mask is not None and mask.rows.tolist() == [1]
    state.close()


def test_retain_keeps_the_live_requests_only(tiny_path) -> None:
    state, params = _ab_or_cd(tiny_path)
    for rid in ("a", "b", "c"):
        state.admit(rid, params, [])
    state.retain({"a": 0, "c": 2})
    assert [state.wants(r) is not None for r in ("a", "b", "c")] == [True, False, True]
    state.close()


def _reasoning(path: str) -> tuple[GrammarState, SamplingParams, int, int]:
    from cadence.model.tiny import build_tokenizer

    tok = build_tokenizer()
    start, end = tok.token_to_id("y"), tok.token_to_id("z")  # stand-ins for <think> / </think>
    spec = StructuredOutputsParams(choice=["ab", "cd"], reasoning_tags=(start, end))
    return GrammarState(path, vocab_size=640, max_rows=4), SamplingParams(
        structured_outputs=spec), start, end


def test_the_grammar_applies_once_the_reasoning_ends(tiny_path) -> None:
    """Under a reasoning parser (vLLM): rows sample freely until the output's end tag, which the
    grammar never sees; then the grammar applies from its start."""
    ids = _ids()
    state, params, start, end = _reasoning(tiny_path)
    state.admit("r", params, [], prompt=[ids["x"], start])  # the template opened the reasoning
    assert state.bitmask(["r"], [0], dict) is None  # free
    state.record("r", 0, ids["d"], state.wants("r"))  # reasoning text the grammar would refuse
    assert state.bitmask(["r"], [1], dict) is None and state.take_failed() == {}
    mask = state.bitmask(["r"], [2], lambda: {"r": end})  # the end tag, still in flight
    assert mask is not None and {ids["a"], ids["c"]} <= _allowed(mask, 0)
    assert ids["b"] not in _allowed(mask, 0)
    state.record("r", 1, end, state.wants("r"))
    state.record("r", 2, ids["a"], state.wants("r"))
    assert _allowed(state.bitmask(["r"], [3], dict), 0) == {ids["b"]}
    state.close()


def test_where_the_reasoning_stands_after_the_prompt(tiny_path) -> None:
    """The prompt's last reasoning tag decides: an end tag (a template that turned thinking
    off) lets the grammar apply at once; a start tag, or none, waits for the output's end tag.
    Readmitted with outputs (after a preemption), the state is rebuilt from them."""
    ids = _ids()
    state, params, start, end = _reasoning(tiny_path)
    state.admit("closed", params, [], prompt=[start, ids["x"], end])
    state.admit("reopened", params, [], prompt=[start, end, ids["x"], start])
    state.admit("none", params, [], prompt=[ids["x"]])
    state.admit("resumed", params, [ids["x"], end, ids["a"]], prompt=[start])
    mask = state.bitmask(["closed", "reopened", "none", "resumed"], [0, 0, 0, 3], dict)
    assert mask is not None and mask.rows.tolist() == [0, 3]
    assert _allowed(mask, 1) == {ids["b"]}
    state.close()


def test_reasoning_tags_are_checked_and_do_not_split_the_compiled_grammars() -> None:
    from cadence.worker.grammar_compiler import spec_key

    plain = StructuredOutputsParams(regex="[0-9]+")
    tagged = StructuredOutputsParams(regex="[0-9]+", reasoning_tags=[5, 6])
    assert tagged.reasoning_tags == (5, 6) and spec_key(plain) == spec_key(tagged)
    for bad in ((5,), (5, 5), (-1, 2), ("a", 2), 7, (True, 2)):
        with pytest.raises(ValueError, match="reasoning_tags"):
            StructuredOutputsParams(regex="x", reasoning_tags=bad)
