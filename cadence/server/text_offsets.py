"""Where each token's text starts in a completion's text: legacy logprobs' ``text_offset``.

A token that holds part of a UTF-8 character (a byte-level BPE token of an emoji's second byte,
a SentencePiece ``<0xF0>`` byte-fallback token) shows as U+FFFD alone, so adding up the tokens'
shown lengths (vLLM's offsets) runs past the text after every multi-byte character. Here the
bytes of one character all start where that character does.

Where the tokenizer's kind gives each token's own bytes (``TokenBytes``: byte-level and
byte-fallback tokenizers), a UTF-8 decoder's state is carried from token to token: a byte that
continues the open character adds nothing, any other byte (ASCII, a lead byte, or a byte that
no character takes) starts a character, and a sequence cut short is one character, as the
decoders' U+FFFD replacement counts them (the maximal-subpart rule of Python's and Rust's
lossy decoding). NOTE: a byte-fallback decoder shows an invalid run of byte tokens as one
U+FFFD per byte, so offsets after such a run may differ by the run's extra bytes; valid text is
exact for both kinds. Other tokenizers go by decoded text: tokens that leave the text ending in
U+FFFD wait (up to ``MAX_PENDING``) for the character they are part of.

``TextCursor`` carries the state between the chunks of a stream, so that a stream's offsets are
the whole answer's.

NOTE: the output processor now repairs the logprob tokens of such characters as vLLM does (the
pieces show "", the completing token the whole character), so shown lengths add up and the
paths above serve tokens still shown with U+FFFD (an invalid byte inside a token's own text).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

__all__ = ["MAX_PENDING", "TextCursor", "next_offset"]

# Tokens that never complete a character by their decoded text are counted after this many
# (a UTF-8 character spans at most four bytes).
MAX_PENDING = 8

_ANY = (0x80, 0xBF)  # a continuation byte


def _lead_table() -> dict[int, tuple[int, int, int]]:
    """Lead byte -> (continuation bytes it takes, the first continuation's range): UTF-8 as
    RFC 3629 restricts it (no overlong forms, no surrogates, nothing past U+10FFFF)."""
    table = {b: (1, *_ANY) for b in range(0xC2, 0xE0)}
    table.update({b: (2, *_ANY) for b in range(0xE1, 0xF0)})
    table[0xE0] = (2, 0xA0, 0xBF)
    table[0xED] = (2, 0x80, 0x9F)
    table.update({b: (3, *_ANY) for b in range(0xF1, 0xF4)})
    table[0xF0] = (3, 0x90, 0xBF)
    table[0xF4] = (3, 0x80, 0x8F)
    return table


_LEADS = _lead_table()


@dataclasses.dataclass
class TextCursor:
    """Where the next token starts (``offset``, in characters) and what is open before it: by
    bytes, the continuation bytes the open character still takes (``need``) and the range its
    next one must fall in (``lo``, ``hi``); by text, the tokens of an unfinished character."""

    offset: int = 0
    need: int = 0
    lo: int = _ANY[0]
    hi: int = _ANY[1]
    pending: list[int] = dataclasses.field(default_factory=list)


def next_offset(cursor: TextCursor, token_id: int, text: str,
                bytes_of: Callable[[int, str], list[int]] | None = None,
                decode_ids: Callable[[list[int]], str] | None = None) -> int:
    """Where token ``token_id`` (shown as ``text``) starts; moves ``cursor`` past it. With
    ``bytes_of`` the offsets go by the tokens' bytes, else with ``decode_ids`` by decoded text;
    with neither, each token counts its shown length. A token with no U+FFFD after a complete
    character (a special token the text skips among them) counts its shown length."""
    # NOTE: a token shown "" may be a piece of a character that never completes (a lead byte
    # cut short by the next token): its bytes still count, as the text's U+FFFD does.
    if bytes_of is not None and (cursor.need or not text or "\ufffd" in text):
        return _by_bytes(cursor, bytes_of(token_id, text))
    if bytes_of is None and decode_ids is not None and (cursor.pending or "\ufffd" in text):
        return _by_text(cursor, token_id, decode_ids)
    start = cursor.offset
    cursor.offset += len(text)
    return start


def _by_bytes(cursor: TextCursor, data: list[int]) -> int:
    """The UTF-8 decoder's step over one token's bytes (``cursor.offset`` counts characters
    from their first byte on, so a token that continues the open one starts one before)."""
    if not data:
        return cursor.offset
    continues = cursor.need and cursor.lo <= data[0] <= cursor.hi
    start = cursor.offset - 1 if continues else cursor.offset
    for b in data:
        if cursor.need and cursor.lo <= b <= cursor.hi:
            cursor.need -= 1
            cursor.lo, cursor.hi = _ANY
            continue
        # ASCII, a lead byte, or one no character takes: a character of its own starts (an
        # open one cut short by it stays one character).
        cursor.offset += 1
        cursor.need, cursor.lo, cursor.hi = _LEADS.get(b, (0, *_ANY))
    return start


def _by_text(cursor: TextCursor, token_id: int,
             decode_ids: Callable[[list[int]], str]) -> int:
    """Tokens whose decoded text ends in U+FFFD share the start of the character they are
    part of, which counts once the text ends in a complete one (or after MAX_PENDING)."""
    start = cursor.offset
    cursor.pending.append(token_id)
    whole = decode_ids(cursor.pending)
    if not whole.endswith("\ufffd") or len(cursor.pending) >= MAX_PENDING:
        cursor.offset += len(whole)
        cursor.pending.clear()
    return start
