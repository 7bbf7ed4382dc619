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
