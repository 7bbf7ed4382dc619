"""A sound characters-per-token bound, so that a text far longer than the context is refused
before it is tokenized.

Tokenizing a multi-megabyte prompt costs seconds; a text of ``n`` characters needs at least
``n / K`` tokens when no token can stand for more than ``K`` characters of the text. ``K`` is
read from the tokenizer's own description (``tokenizer.json``): the longest vocabulary entry or
added token, times how much the normalizer may shrink the text. Where a stage of the pipeline can
make one token stand for an unbounded run of text (an unknown-word token, a normalizer or
pre-tokenizer that deletes characters, an added token that swallows whitespace, a vocabulary
that can spell some character neither whole nor in bytes, so drops it) there is no such ``K``
and no early refusal: the text is tokenized and measured as usual.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from cadence.byte_level import byte_level_table

__all__ = ["MAX_CANONICAL_DECOMPOSITION", "max_chars_per_token"]

logger = logging.getLogger(__name__)

# A canonical composition (NFC, NFKC) merges a starter with the marks that follow it; a
# precomposed character's full canonical decomposition has at most this many code points
# (tests/engine/test_prompt_bound.py checks it against unicodedata), so composition divides the
# length of a text by at most this much.
MAX_CANONICAL_DECOMPOSITION = 4

# Normalizers that never shorten a text (decompositions, case mapping, prefixing).
_GROWING_NORMALIZERS = {"NFD", "NFKD", "Lowercase", "Prepend"}
_COMPOSING_NORMALIZERS = {"NFC", "NFKC"}
# Pre-tokenizers that keep every character (they split, map bytes, or replace spaces one for
# one); Split and Punctuation are checked apart: their "removed" behaviour drops characters.
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"}


def max_chars_per_token(tokenizer: Any) -> int | None:
    """The most characters of a prompt text that one token can stand for, or None when the
    tokenizer gives no such bound (or is not a fast tokenizer whose pipeline can be read)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    to_str = getattr(backend, "to_str", None)
    if to_str is None:
        return None
    try:
        spec = json.loads(to_str())
    except Exception:  # an exotic backend: no early check, nothing else changes
        logger.debug("Could not read the tokenizer's pipeline.", exc_info=True)
        return None
    return _bound_from_spec(spec)


def _bound_from_spec(spec: dict[str, Any]) -> int | None:
    if spec.get("truncation") is not None:
        return None  # a truncating tokenizer fits any text
    shrink = _normalizer_shrink(spec.get("normalizer"))
    if shrink is None or not _keeps_characters(spec.get("pre_tokenizer")):
        return None
    model = spec.get("model") or {}
    longest = _longest_model_token(model, _byte_level(spec.get("pre_tokenizer")))
    if longest is None:
        return None
    for added in spec.get("added_tokens") or []:
        if added.get("lstrip") or added.get("rstrip"):
            return None  # it also consumes the whitespace around it, however long
        longest = max(longest, len(added.get("content", "")))
    return max(longest, 1) * shrink


def _longest_model_token(model: dict[str, Any], byte_level: bool) -> int | None:
    # Only BPE maps every piece of text to tokens whose strings spell it out. Its unknown token
    # (without byte fallback) can stand for a whole run of unknown characters, and a character
    # it can spell in no way, neither through an unknown token nor through bytes, is dropped:
    # a run of such characters costs no token at all.
    if model.get("type") != "BPE":
        return None
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        return None
    if model.get("byte_fallback"):
        if any(f"<0x{b:02X}>" not in vocab for b in range(256)):
            return None
    elif model.get("unk_token") is not None:
        return None
    elif not (byte_level and all(ch in vocab for ch in byte_level_table())):
        return None
    return max(len(token) for token in vocab)


def _byte_level(pre_tokenizer: dict[str, Any] | None) -> bool:
    """Whether the pre-tokenizer maps the text to GPT-2's byte characters."""
    if pre_tokenizer is None:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_byte_level(p) for p in pre_tokenizer.get("pretokenizers") or [])
    return pre_tokenizer.get("type") == "ByteLevel"


def _normalizer_shrink(normalizer: dict[str, Any] | None) -> int | None:
    """How many times shorter the normalized text can be (None: unbounded)."""
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Sequence":
        total = 1
        for part in normalizer.get("normalizers") or []:
            factor = _normalizer_shrink(part)
            if factor is None:
                return None
            total *= factor
        return total
    if kind in _GROWING_NORMALIZERS:
        return 1
    if kind in _COMPOSING_NORMALIZERS:
        return MAX_CANONICAL_DECOMPOSITION
    if kind == "Replace":
        pattern = (normalizer.get("pattern") or {}).get("String")
        content = normalizer.get("content")
        if not isinstance(pattern, str) or not isinstance(content, str) or not pattern:
            return None  # a regex pattern can match runs of any length
        if not content:
            return None
        return max(1, -(-len(pattern) // len(content)))
    return None  # Strip, StripAccents, BertNormalizer, Precompiled...: they delete characters


def _keeps_characters(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_keeps_characters(p) for p in pre_tokenizer.get("pretokenizers") or [])
    if kind in ("Split", "Punctuation"):
        return pre_tokenizer.get("behavior") != "Removed"
    return kind in _KEEPING_PRE_TOKENIZERS
