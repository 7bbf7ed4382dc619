"""The characters-per-token bound is sound: a text it refuses can never fit the context."""

from __future__ import annotations

import sys
import unicodedata
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers
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


# A byte-level vocabulary spells every byte (GPT-2's 256 characters), a byte-fallback one has
# every <0xNN> token: written out here, not taken from the code under test.
_GPT2_BYTES = [chr(c) for c in [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100),
                                *range(0x100, 0x144)]]
_BYTE_LEVEL_VOCAB = {**{ch: i for i, ch in enumerate(_GPT2_BYTES)}, "a": 256, "abcd": 257}
_FALLBACK_VOCAB = {**{f"<0x{b:02X}>": b for b in range(256)}, "a": 256, "abcd": 257}


def _spec(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "truncation": None,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel"},
        "model": {"type": "BPE", "unk_token": None, "vocab": _BYTE_LEVEL_VOCAB},
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
        ({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "behavior": "Isolated"}, {"type": "ByteLevel"}]}}, 12),
        ({"model": {"type": "WordPiece", "vocab": {"a": 0}}}, None),
        ({"model": {"type": "BPE", "unk_token": "<unk>", "vocab": {"a": 0}}}, None),
        ({"model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True,
                    "vocab": _FALLBACK_VOCAB}}, 12),
        # Byte fallback short of a byte's token: that byte is dropped, whatever its run.
        ({"model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True,
                    "vocab": {"<0x41>": 0}}}, None),
        # No unknown token, no byte fallback: a character the vocabulary cannot spell is
        # dropped (a run of them costs no token), unless byte-level text spells every byte.
        ({"model": {"type": "BPE", "unk_token": None, "vocab": {"a": 0, "abcd": 1}}}, None),
        ({"pre_tokenizer": {"type": "Metaspace"}}, None),
        ({"added_tokens": [{"content": "<x>", "lstrip": True, "rstrip": False}]}, None),
        ({"added_tokens": [{"content": "<x>", "lstrip": False, "rstrip": True}]}, None),
        ({"pre_tokenizer": None,  # Llama-2's: no pre-tokenizer, byte fallback
          "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True,
                    "vocab": _FALLBACK_VOCAB}}, 12),
        ({"normalizer": {"type": "Replace", "pattern": {"String": "\u200b"}, "content": ""}}, None),
        # "abc" -> "xy": 3 characters become 2, so 12 * ceil(3 / 2).
        ({"normalizer": {"type": "Replace", "pattern": {"String": "abc"}, "content": "xy"}}, 24),
        ({"pre_tokenizer": {"type": "Sequence",
                            "pretokenizers": [{"type": "Whitespace"}, {"type": "ByteLevel"}]}}, None),
        ({"pre_tokenizer": {"type": "Sequence",
                            "pretokenizers": [{"type": "Digits"}, {"type": "ByteLevel"}]}}, 12),
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


def _byte_fallback_bpe(
    normalizer: Any, pre_tokenizer: Any, corpus: list[str], vocab_size: int = 400
) -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE (byte fallback, so every text encodes) behind the given
    normalizer and pre-tokenizer (None: the stage is left out of the pipeline)."""
    tk = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    if normalizer is not None:
        tk.normalizer = normalizer
    if pre_tokenizer is not None:
        tk.pre_tokenizer = pre_tokenizer
    alphabet = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", *alphabet], show_progress=False
    )
    tk.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>")


def _assert_sound(tokenizer: Any, k: int, text: str) -> None:
    n = len(tokenizer.encode(text, add_special_tokens=False))
    assert n * k >= len(text), (text[:40], n, k)


def test_a_llama2_style_pipeline_without_a_pre_tokenizer_is_bounded() -> None:
    """Llama-2 and Mistral have no pre-tokenizer: their normalizer only prepends and swaps a
    space for one "▁", so no text shrinks and the bound is the longest vocabulary entry."""
    llama = _byte_fallback_bpe(
        normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]),
        None, CORPUS,
    )
    assert llama.backend_tokenizer.pre_tokenizer is None
    k = max_chars_per_token(llama)
    assert k == max(len(t) for t in llama.get_vocab())
    for text in ["the quick brown fox jumps", " " * 300, "日本語🙂" * 40, CORPUS[0] * 5]:
        _assert_sound(llama, k, text)


def test_an_added_token_that_strips_whitespace_on_its_right_gives_no_bound() -> None:
    """An ``rstrip`` added token (Phi-3's ``<|end|>``) swallows the whitespace after it, however
    long: the token count does not grow with it, so no characters-per-token bound holds."""
    tok = byte_level_tokenizer(CORPUS, 300, ["<|eos|>"])
    tok.add_tokens([AddedToken("<|end|>", rstrip=True, special=False)])
    counts = {len(tok.encode("hi<|end|>" + " " * m, add_special_tokens=False))
              for m in (1, 100, 5000)}
    assert len(counts) == 1  # the tokenizer's own behaviour: the spaces cost no tokens
    assert max_chars_per_token(tok) is None


def test_a_replace_normalizer_that_deletes_gives_no_bound() -> None:
    """Replacing a character with nothing (a zero-width space) lets a text of any length
    normalize to nothing: no bound, and reading the pipeline does not fail."""
    tok = _byte_fallback_bpe(normalizers.Replace("\u200b", ""), pre_tokenizers.Metaspace(), CORPUS)
    assert len(tok.encode("a" + "\u200b" * 5000, add_special_tokens=False)) <= 2
    assert max_chars_per_token(tok) is None


def test_a_shrinking_replace_rounds_its_ratio_up() -> None:
    """Replace("abc" -> "xy") makes a text 3/2 times shorter: the bound must allow for the
    whole 1.5, not round it down to 1, or a long run of "abc" is refused though it fits."""
    tok = _byte_fallback_bpe(normalizers.Replace("abc", "xy"), None, ["xy" * 64] * 10, 300)
    k = max_chars_per_token(tok)
    assert k is not None
    longest = max(len(t) for t in tok.get_vocab())
    assert k >= longest * 3 / 2
    for m in (1, 64, 640, 6400):
        _assert_sound(tok, k, "abc" * m)


def test_a_pre_tokenizer_sequence_needs_every_member_to_keep_characters() -> None:
    """A Sequence with a whitespace splitter (which drops the spaces) deletes characters even
    when its other member keeps them: a run of spaces costs no tokens, so no bound."""
    tok = _byte_fallback_bpe(
        None, pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()]),
        CORPUS,
    )
    assert len(tok.encode("a" + " " * 5000 + "b", add_special_tokens=False)) < 10
    assert max_chars_per_token(tok) is None


def test_a_vocabulary_that_cannot_spell_a_character_gives_no_bound() -> None:
    """A BPE with neither an unknown token nor byte fallback drops each character it cannot
    spell: a run of them costs no token at all, so no bound (and no early refusal); the same
    vocabulary behind a byte-level pre-tokenizer that spells every byte keeps one."""
    tk = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk)
    assert tok.encode("日" * 10_000, add_special_tokens=False) == []
    assert max_chars_per_token(tok) is None
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tk = Tokenizer(models.BPE(vocab={**{ch: i for i, ch in enumerate(sorted(alphabet))},
                                     "ab": len(alphabet)}, merges=[("a", "b")]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk)
    assert len(tok.encode("日" * 100, add_special_tokens=False)) == 300  # three bytes each
    assert max_chars_per_token(tok) == 2
