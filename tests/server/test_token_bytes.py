"""A token's own bytes for the chat logprobs: tokens of a text, joined, are the text's UTF-8
(the tokenizer's encoding is the oracle), byte-level and byte-fallback alike; a token that is
part of a character shows its byte, not U+FFFD's."""

from __future__ import annotations

import httpx
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from cadence.model.tiny import ensure_tiny_model
from cadence.server.token_bytes import TokenBytes, byte_level_table

TEXTS = ["plain words", "héllo wörld", "emoji 😀 and 中文", "\u00a0\u0100\x7f tab\there"]
REPLACEMENT = list("\ufffd".encode())


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return AutoTokenizer.from_pretrained(str(ensure_tiny_model()))


def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE: a few pieces, every byte as <0xNN>, ▁ for a space."""
    from tokenizers import Tokenizer, decoders, normalizers
    from tokenizers.models import BPE

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for piece in ("▁", "a", "b", "▁a", "ab"):
        vocab[piece] = len(vocab)
    tok = Tokenizer(BPE(vocab, [("▁", "a"), ("a", "b")], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_the_byte_level_table_covers_every_byte_once() -> None:
    table = byte_level_table()
    assert len(table) == 256 and sorted(table.values()) == list(range(256))
    assert table["Ġ"] == ord(" ") and table["a"] == ord("a")  # GPT-2's space and a letter


@pytest.mark.parametrize("kind", ["byte_level", "byte_fallback"])
def test_a_texts_tokens_join_into_its_utf8(tiny_tokenizer, kind: str) -> None:
    tok = tiny_tokenizer if kind == "byte_level" else byte_fallback_tokenizer()
    token_bytes = TokenBytes(tok)
    assert token_bytes.kind == kind
    partial = 0
    for text in (TEXTS if kind == "byte_level" else ["ab a", "a😀b", "é b"]):
        ids = tok.encode(text, add_special_tokens=False)
        shown = [token_bytes.bytes_of(i, tok.decode([i])) for i in ids]
        assert b"".join(bytes(b) for b in shown) == text.encode("utf-8"), (text, shown)
        partial += sum("\ufffd" in tok.decode([i]) for i in ids)
        assert REPLACEMENT not in shown
    assert partial  # some tokens were parts of characters


def test_whole_tokens_and_other_tokenizers_keep_their_texts_bytes(tiny_tokenizer) -> None:
    token_bytes = TokenBytes(tiny_tokenizer)
    assert token_bytes.bytes_of(0, "hello") == list(b"hello")  # no U+FFFD: the text's
    assert TokenBytes(None).bytes_of(5, "\ufffd") == REPLACEMENT
    assert token_bytes.bytes_of(10**9, "\ufffd") == REPLACEMENT  # no such token


def test_chat_logprobs_bytes_of_partial_characters(server, tiny_tokenizer) -> None:
    """Pushed by logit_bias onto the four byte tokens of an emoji, the answer's logprobs show
    each token's byte; together they are the emoji."""
    ids = tiny_tokenizer.encode("😀", add_special_tokens=False)
    assert len(ids) > 1 and all("\ufffd" in tiny_tokenizer.decode([i]) for i in ids)
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        resp = http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "logprobs": True,
            "top_logprobs": 2, "temperature": 0, "return_token_ids": True,
            "logit_bias": {str(i): 100 for i in ids}})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    content = choice["logprobs"]["content"]
    got = choice["token_ids"]
    assert len(content) == len(got) and set(got) <= set(ids)
    table = byte_level_table()
    for tid, entry in zip(got, content, strict=True):
        piece = tiny_tokenizer.convert_ids_to_tokens(tid)
        assert entry["bytes"] == [table[ch] for ch in piece]
        assert entry["bytes"] != REPLACEMENT


def test_a_token_ending_in_a_real_replacement_character_keeps_its_bytes() -> None:
    """A token whose own text ends in U+FFFD (the character itself, three bytes) reads as a
    piece of a character, which logprobs show as ""; its bytes are still its own."""
    from tests.server.test_text_offsets import _multibyte_tokenizer

    tok = _multibyte_tokenizer()
    token_bytes = TokenBytes(tok)
    real = [t for t in range(len(tok)) if (own := token_bytes._own(t)) is not None
            and own.decode("utf-8", "replace").endswith("\ufffd") and b"\xef\xbf\xbd" in own
            and own.endswith(b"\xef\xbf\xbd")]
    assert real  # the multibyte corpus holds U+FFFD itself
    for t in real:
        assert token_bytes.bytes_of(t, "") == list(token_bytes._own(t))


def test_an_added_token_partly_outside_the_byte_table_keeps_its_texts_bytes() -> None:
    """DeepSeek's ``<｜end▁of▁sentence｜>`` is written as itself, and some of its characters
    ("<", "e") are in GPT-2's byte table while others ("｜", "▁") are not: it has no byte-level
    bytes of its own, so it shows its text's UTF-8 (and nothing when shown as "")."""
    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))  # not the shared fixture
    special = "<｜end▁of▁sentence｜>"
    tok.add_special_tokens({"additional_special_tokens": [special]})
    tid = tok.convert_tokens_to_ids(special)
    table = byte_level_table()
    assert "<" in table and "｜" not in table  # it mixes both kinds of characters
    token_bytes = TokenBytes(tok)
    assert token_bytes.kind == "byte_level"
    assert token_bytes.bytes_of(tid, tok.decode([tid])) == list(special.encode("utf-8"))
    assert token_bytes.bytes_of(tid, "") == []
