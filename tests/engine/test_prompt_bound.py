"""The characters-per-token bound is sound: a text it refuses can never fit the context."""

from __future__ import annotations

import sys
import unicodedata
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from cadence.engine.input_processor import InputProcessor, InputValidationError
from cadence.engine.prompt_bound import (
    MAX_CANONICAL_DECOMPOSITION,
    _bound_from_spec,
    max_chars_per_token,
)
from cadence.model.tiny import ensure_tiny_model
from tests.tokenizers_helper import byte_level_tokenizer

CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world", "éèê ñ 日本語 🙂"] * 20


@pytest.fixture(scope="module")
def tiny_tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(ensure_tiny_model()))


@pytest.fixture(scope="module")
def nfc_tokenizer() -> PreTrainedTokenizerFast:
    """A char-level BPE with byte fallback behind an NFC normalizer (which shortens texts)."""
    tk = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    alphabet = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", *alphabet], show_progress=False
    )
    tk.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>")


def test_canonical_decomposition_bound_matches_unicodedata() -> None:
    longest = max(
        len(unicodedata.normalize("NFD", chr(c))) for c in range(sys.maxunicode + 1)
    )
    assert longest == MAX_CANONICAL_DECOMPOSITION


def test_bounds_of_real_pipelines(tiny_tokenizer, nfc_tokenizer) -> None:
    k = max_chars_per_token(tiny_tokenizer)
    longest = max(len(t) for t in tiny_tokenizer.get_vocab())
    assert k == longest  # byte-level BPE, no normalizer: the longest entry
    assert max_chars_per_token(nfc_tokenizer) is not None
    assert max_chars_per_token(nfc_tokenizer) % MAX_CANONICAL_DECOMPOSITION == 0
    assert max_chars_per_token(object()) is None  # not a fast tokenizer: no early check


def _spec(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "truncation": None,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel"},
        "model": {"type": "BPE", "unk_token": None, "vocab": {"a": 0, "abcd": 1}},
        "added_tokens": [{"content": "<|im_start|>", "lstrip": False, "rstrip": False}],
    }
    base.update(kw)
    return base


@pytest.mark.parametrize(
    "change,expected",
    [
        ({}, 12),
        ({"normalizer": {"type": "NFC"}}, 48),
        ({"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Lowercase"}]}}, 12),
        ({"normalizer": {"type": "Replace", "pattern": {"String": "  "}, "content": " "}}, 24),
        ({"normalizer": {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}}, None),
        ({"normalizer": {"type": "Strip"}}, None),
        ({"normalizer": {"type": "BertNormalizer"}}, None),
        ({"pre_tokenizer": {"type": "Whitespace"}}, None),
        ({"pre_tokenizer": {"type": "Split", "behavior": "Removed"}}, None),
        ({"pre_tokenizer": {"type": "Split", "behavior": "Isolated"}}, 12),
        ({"model": {"type": "WordPiece", "vocab": {"a": 0}}}, None),
        ({"model": {"type": "BPE", "unk_token": "<unk>", "vocab": {"a": 0}}}, None),
        ({"model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "vocab": {"<0x41>": 0}}}, 12),
        ({"added_tokens": [{"content": "<x>", "lstrip": True, "rstrip": False}]}, None),
        ({"truncation": {"max_length": 8}}, None),
    ],
)
def test_bound_from_spec(change: dict[str, Any], expected: int | None) -> None:
    assert _bound_from_spec(_spec(**change)) == expected


texts = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=300
) | st.sampled_from(["e\u0301" * 50, "\u1100\u1161\u11a8" * 40, " " * 200, "🙂" * 80])


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts)
def test_no_text_needs_fewer_tokens_than_the_bound_says(tiny_tokenizer, nfc_tokenizer, text) -> None:
    for tokenizer in (tiny_tokenizer, nfc_tokenizer):
        k = max_chars_per_token(tokenizer)
        assert k is not None
        n = len(tokenizer.encode(text, add_special_tokens=False))
        assert n * k >= len(text), (text, n, k)


def test_input_processor_refuses_before_tokenizing(tiny_tokenizer) -> None:
    calls = []

    class Counting:
        def encode(self, text: str) -> list[int]:
            calls.append(len(text))
            return tiny_tokenizer.encode(text)

    k = max_chars_per_token(tiny_tokenizer)
    proc = InputProcessor(Counting(), vocab_size=len(tiny_tokenizer), max_model_len=64,
                          eos_token_ids=[0], max_chars_per_token=k)
    from cadence.sampling_params import SamplingParams

    with pytest.raises(InputValidationError, match="maximum context length is 64") as info:
        proc.process("r1", "x" * (k * 63 + 1), SamplingParams(max_tokens=1))
    assert info.value.parameter == "prompt" and calls == []
    # At the bound itself the text might fit: it is tokenized and measured.
    with pytest.raises(InputValidationError, match=r"your request has \d+ input tokens\."):
        proc.process("r2", "a" * (k * 63), SamplingParams(max_tokens=1))
    assert calls == [k * 63]


def test_byte_level_helper_tokenizer_is_bounded() -> None:
    tok = byte_level_tokenizer(CORPUS, 300, ["<|end|>"])
    assert max_chars_per_token(tok) == max(len(t) for t in tok.get_vocab())
