"""Legacy logprobs' text_offset (``cadence/server/text_offsets.py``): the bytes of one character
share its start, a byte that no character takes is a character of its own, and a stream's
offsets are the whole answer's wherever its chunks are cut. Expected offsets come from Python's
own UTF-8 decoder, a tokenizer's offset mapping, or are worked out by hand."""

from __future__ import annotations

import codecs
import random

import pytest
from transformers import AutoTokenizer

from cadence.engine.request_state import TokenTextCache
from cadence.model.tiny import ensure_tiny_model
from cadence.outputs import Logprob
from cadence.server.serving_completion import completion_logprobs
from cadence.server.text_offsets import MAX_PENDING, TextCursor, next_offset
from cadence.server.token_bytes import TokenBytes
from tests.server.test_token_bytes import byte_fallback_tokenizer


@pytest.fixture(scope="module")
def tiny():
    return AutoTokenizer.from_pretrained(str(ensure_tiny_model()))


def _offsets(tok, ids: list[int], cuts: list[int] = (), by_bytes: bool = True,
             repaired: bool = False) -> list[int]:
    """text_offset of ``ids`` sent in chunks cut at ``cuts``, as the server computes it.
    ``repaired``: the tokens shown as the output processor shows them (a piece of a character
    "", the token completing it the whole character), else each decoded alone."""
    bytes_of = TokenBytes(tok).bytes_of if by_bytes else None
    texts = ([TokenTextCache(tok).in_context(t, ids[:i]) for i, t in enumerate(ids)]
             if repaired else [tok.decode([t]) for t in ids])
    cursor = TextCursor()
    out: list[int] = []
    for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True):
        chunk = ids[a:b]
        rows = [{t: Logprob(-1.0, 1, text)} for t, text in zip(chunk, texts[a:b], strict=True)]
        out += completion_logprobs(chunk, rows, 0, cursor, decode_ids=tok.decode,
                                   bytes_of=bytes_of).text_offset
    return out


def _continues(pending: bytes, byte: int) -> bool:
    """Whether ``byte`` after ``pending`` still begins a valid UTF-8 character: padded with
    continuation bytes, Python's strict decoder takes it (an incremental decoder would wait on
    a surrogate's or an overlong form's prefix instead of refusing it)."""
    head = pending + bytes([byte])
    for pad in range(4):
        try:
            (head + b"\x80" * pad).decode("utf-8")
        except UnicodeDecodeError:
            continue
        return True
    return False


def _decoder_offsets(pieces: list[bytes]) -> tuple[str, list[int]]:
    """The text Python's lossy UTF-8 decoder makes of the pieces' bytes, and the index of the
    character each piece's first byte falls in: fed byte by byte, the decoder's pending bytes
    are characters to come, of which a byte either continues the one they begin or follows
    all of them (as many as the pending bytes make cut short)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text, starts = "", []
    for piece in pieces:
        for i, byte in enumerate(piece):
            pending = decoder.getstate()[0]
            if i == 0:
                ahead = 0 if _continues(pending, byte) else len(pending.decode("utf-8",
                                                                               "replace"))
                starts.append(len(text) + ahead)
            text += decoder.decode(bytes([byte]))
    return text + decoder.decode(b"", final=True), starts


def test_the_decoder_oracle_on_hand_worked_bytes() -> None:
    # The oracle itself: a stray byte, a character cut short by ASCII, the euro sign.
    assert _decoder_offsets([b"\xa9", b"\xa9", b"H"]) == ("\ufffd\ufffdH", [0, 1, 2])
    assert _decoder_offsets([b"\xe2", b"\x82", b"H"]) == ("\ufffdH", [0, 0, 1])
    assert _decoder_offsets([b"\xe2\x82", b"\xaca", b"b"]) == ("€ab", [0, 0, 2])
    # 0xED takes 0x80-0x9F only (no surrogates): 0xED 0xB2 are two characters.
    assert _decoder_offsets([b"\xed", b"\xb2", b"U"]) == ("\ufffd\ufffdU", [0, 1, 2])


# Byte tokens of the tiny tokenizer: 0xA9 alone is a stray continuation byte (a U+FFFD of its
# own), 0xE2 0x82 0xAC spell the euro sign, 0xE2 alone is a character cut short (one U+FFFD),
# 72 is "H". Offsets by UTF-8's rules, worked out by hand.
_STRAY, _EURO, _H = 169, [226, 130, 172], 72
_BYTE_CASES = [
    ([_STRAY, _STRAY, _H], "\ufffd\ufffdH", [0, 1, 2]),
    ([_STRAY, *_EURO], "\ufffd€", [0, 1, 1, 1]),
    ([*_EURO, _STRAY, *_EURO], "€\ufffd€", [0, 0, 0, 1, 2, 2, 2]),
    ([226, _H], "\ufffdH", [0, 1]),
    ([226, 130, _H, _STRAY], "\ufffdH\ufffd", [0, 0, 1, 2]),
    ([226, 226, 130, 172, _H], "\ufffd€H", [0, 1, 1, 1, 2]),
    ([_H, _STRAY, _STRAY, _STRAY, _STRAY, _STRAY, _H], "H" + "\ufffd" * 5 + "H",
     [0, 1, 2, 3, 4, 5, 6]),
]


@pytest.mark.parametrize(("ids", "text", "offsets"), _BYTE_CASES,
                         ids=[f"case{i}" for i in range(len(_BYTE_CASES))])
def test_stray_bytes_are_characters_of_their_own(tiny, ids, text, offsets) -> None:
    """A byte no character takes shows as its own U+FFFD and counts one character: the tokens
    after it start past it, whole or in chunks cut anywhere."""
    assert tiny.decode(ids) == text  # the cases' bytes, as the tokenizer spells them
    for cut in range(len(ids)):
        assert _offsets(tiny, ids, [cut] if cut else []) == offsets, cut
        # As served: a character's pieces show "" (one cut short by the next token too).
        assert _offsets(tiny, ids, [cut] if cut else [], repaired=True) == offsets, cut


def test_a_character_split_across_streamed_chunks_keeps_its_offsets(tiny) -> None:
    """Chunks of several tokens (a slow reader's merged deltas): the bytes of a character that
    the first chunk ends inside are carried into the next, whose offsets continue from the
    first chunk's tokens (not from the text sent, which holds that character back)."""
    ids = tiny.encode("x€ ab", add_special_tokens=False)
    assert len(ids) == 6  # x, three bytes of €, " a", b
    whole = [0, 1, 1, 1, 2, 4]  # "x" 0, € at 1 (three tokens), " a" at 2, "b" at 4
    for cuts in ([], [1], [2], [3], [4], [5], [1, 2, 3], [2, 4], [1, 2, 3, 4, 5]):
        assert _offsets(tiny, ids, cuts) == whole, cuts
        assert _offsets(tiny, ids, cuts, by_bytes=False) == whole, cuts


def _multibyte_tokenizer():
    """A byte-level BPE trained on text of two-, three- and four-byte characters, so that its
    merges make tokens that end one character and start the next (and a real U+FFFD's)."""
    from tests.tokenizers_helper import byte_level_tokenizer

    rng = random.Random(1)
    alphabet = "aé€好😀\ufffdж "
    corpus = ["".join(rng.choice(alphabet) for _ in range(40)) for _ in range(200)]
    return byte_level_tokenizer(corpus, 420, ["<eos>"])


@pytest.mark.parametrize("which", ["tiny", "multibyte"])
def test_random_byte_level_tokens_follow_a_utf8_decoder(tiny, which) -> None:
    """Any run of byte-level tokens (valid text, stray bytes, characters cut short, tokens that
    end one character and start the next): each token starts at the character its first byte
    falls in, as Python's decoder places it, and the tokenizer's text is that decoder's."""
    tok = tiny if which == "tiny" else _multibyte_tokenizer()
    token_bytes = TokenBytes(tok)
    vocab = [t for t in range(len(tok)) if token_bytes._own(t) is not None]
    partial = [t for t in vocab if "\ufffd" in tok.decode([t])]
    straddling = [t for t in partial if len(token_bytes._own(t)) > 1]
    assert which == "tiny" or len(straddling) >= 20  # the tokens these cases are about
    rng = random.Random(7)
    for trial in range(300):
        ids = [rng.choice(partial if rng.random() < 0.6 else vocab)
               for _ in range(rng.randrange(1, 14))]
        text, expected = _decoder_offsets([token_bytes._own(t) for t in ids])
        assert tok.decode(ids) == text, ids
        cut = rng.randrange(len(ids))
        assert _offsets(tok, ids) == expected, (trial, ids)
        assert _offsets(tok, ids, [cut] if cut else []) == expected, (trial, ids, cut)
        assert _offsets(tok, ids, [cut] if cut else [], repaired=True) == expected, (trial, ids)


@pytest.mark.parametrize("text", ["€a", "a😀 a", "жa", "ab 中文 😀😀 é", "b€€好😀😀好a"])
def test_byte_fallback_characters_share_their_start(text) -> None:
    """A SentencePiece-style tokenizer (``<0xNN>`` byte tokens, whose incomplete runs it
    shows as one U+FFFD per byte): each token starts where the tokenizer's own offset mapping
    puts it, whole or in chunks cut anywhere."""
    tok = byte_fallback_tokenizer()
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, expected = enc["input_ids"], [start for start, _ in enc["offset_mapping"]]
    assert tok.decode(ids) == text and TokenBytes(tok).kind == "byte_fallback"
    for cut in range(len(ids)):
        assert _offsets(tok, ids, [cut] if cut else []) == expected, cut


def test_other_tokenizers_wait_for_a_characters_last_token() -> None:
    """Without a tokenizer kind that gives tokens' bytes, offsets go by decoded text: tokens
    whose text stays one U+FFFD share its start, counted after MAX_PENDING of them."""
    ids = list(range(1, MAX_PENDING + 2))
    rows = [{t: Logprob(-1.0, 1, "\ufffd")} for t in ids]
    out = completion_logprobs(ids, rows, 0, decode_ids=lambda seq: "\ufffd")
    assert out.text_offset == [0] * MAX_PENDING + [1]


def test_a_token_without_bytes_inside_an_unfinished_character(tiny) -> None:
    """A skipped special token (shown "", no bytes of its own) between an emoji's byte tokens
    adds no character: the emoji's bytes all start at 0, the text after it at 1, and the special
    token sits after the open emoji (which counts from its first byte on)."""
    emoji = tiny.encode("😀", add_special_tokens=False)
    assert len(emoji) >= 2 and tiny.decode(emoji[:1]) == "\ufffd"  # its first token is a piece
    (a,) = tiny.encode("a", add_special_tokens=False)
    eos = tiny.eos_token_id
    bytes_of = TokenBytes(tiny).bytes_of
    assert bytes_of(eos, "") == []
    stream = [emoji[0], eos, *emoji[1:], a]
    # As the output processor shows them: the pieces "", the token completing the emoji all of
    # it, the skipped special token "".
    shown = ["", "", *[""] * (len(emoji) - 2), "😀", "a"]
    cursor = TextCursor()
    offsets = [next_offset(cursor, t, text, bytes_of)
               for t, text in zip(stream, shown, strict=True)]
    assert offsets == [0, 1, *[0] * (len(emoji) - 1), 1]
