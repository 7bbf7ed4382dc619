"""A token's own bytes, for the chat logprobs' ``bytes`` fields.

A token that holds part of a UTF-8 character (a byte-level BPE token of an emoji's second byte,
a SentencePiece ``<0xF0>`` byte-fallback token) has no text of its own: it decodes to U+FFFD,
whose UTF-8 is not its bytes. OpenAI's ``bytes`` are the token's bytes, so that a client can
join them into the characters. ``TokenBytes`` finds them from the tokenizer's vocabulary: a
byte-level token's characters through GPT-2's byte-to-character table, a byte-fallback token's
``<0xNN>``. Other tokens, and tokenizers of other kinds, keep their text's UTF-8.
"""

from __future__ import annotations

import json
import re
from typing import Any

from cadence.byte_level import byte_level_table

__all__ = ["TokenBytes", "byte_level_table"]

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _decoder_kind(tokenizer: Any) -> str | None:
    """"byte_level", "byte_fallback" or None, from a fast tokenizer's decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        decoder = json.loads(backend.to_str()).get("decoder") or {}
    except (AttributeError, TypeError, ValueError):
        return None
    parts = [decoder]
    if decoder.get("type") == "Sequence":
        parts = decoder.get("decoders") or []
    kinds = {p.get("type") for p in parts if isinstance(p, dict)}
    if "ByteLevel" in kinds:
        return "byte_level"
    return "byte_fallback" if "ByteFallback" in kinds else None


def _complete_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class TokenBytes:
    """``bytes_of(token_id, text)``: the bytes the logprobs show for a token whose text is
    ``text``. Built once per tokenizer (it reads the decoder's description)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.kind = _decoder_kind(tokenizer) if tokenizer is not None else None

    def bytes_of(self, token_id: int, text: str) -> list[int]:
        # A piece of a character shows "" (or U+FFFD), and the token completing it the whole
        # character: either way its own bytes are not its text's.
        if self.kind is not None and (not text or not text.isascii()):
            own = self._own(token_id)
            if own is not None and (not _complete_utf8(own) or (
                    # A real U+FFFD at a token's end reads as a piece: shown "", its bytes
                    # still are its own.
                    not text and own.decode("utf-8").endswith("\ufffd"))):
                return list(own)
        return list(text.encode("utf-8"))

    def _own(self, token_id: int) -> bytes | None:
        try:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
        except (IndexError, KeyError, OverflowError, TypeError, ValueError):
            return None
        if not isinstance(piece, str):
            return None
        if self.kind == "byte_level":
            table = byte_level_table()
            if all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
            return None  # an added token (written as itself)
        match = _BYTE_FALLBACK.match(piece)
        return bytes([int(match.group(1), 16)]) if match else None
