from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from cadence.core_types import EngineCoreRequest
from cadence.engine.detokenizer import (
    IncrementalDetokenizer,
    TextDecoder,
    find_stop_string,
    make_decode_fn,
)
from cadence.sampling_params import SamplingParams
from tests.tokenizers_helper import byte_level_tokenizer

CORPUS = [
    "hello world, the quick brown fox jumps over the lazy dog.",
    "the world is wide and the stop sign is red. STOP here, or stop there.",
    "emoji 😀 😁 😂 smile 😀😀 and more text",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """A tiny byte-level BPE: CJK characters stay split into single-byte tokens."""
    return byte_level_tokenizer(CORPUS, vocab_size=330, special_tokens=["<|eos|>", "<|pad|>"])


def byte_ids(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    """One token per UTF-8 byte of ``text`` (every multi-byte character is split)."""
    table = _bytes_to_unicode()
    return [tok.convert_tokens_to_ids(table[b]) for b in text.encode("utf-8")]


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's byte -> printable character map used by the ByteLevel pre-tokenizer.
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _request(prompt: list[int], **kw: object) -> EngineCoreRequest:
    return EngineCoreRequest("r", prompt, SamplingParams(**kw))  # type: ignore[arg-type]


def _stream(
    detok: IncrementalDetokenizer, ids: list[int], chunks: int = 1, stop_terminated: bool = False
) -> tuple[list[str], str | None]:
    """Feed ``ids`` ``chunks`` at a time as DELTA; return the deltas and the stop string."""
    deltas, stop = [], None
    for i in range(0, len(ids), chunks):
        last = i + chunks >= len(ids)
        stop = detok.update(ids[i : i + chunks], stop_terminated and last)
        done = last or stop is not None
        deltas.append(detok.get_next_output_text(done, delta=True))
        if stop is not None:
            break
    return deltas, stop


def test_ascii_deltas_concatenate_to_decode(tokenizer: PreTrainedTokenizerFast) -> None:
    prompt = tokenizer.encode("the quick")
    ids = tokenizer.encode(" brown fox jumps over the lazy dog, hello world.")
    detok = IncrementalDetokenizer(tokenizer, _request(prompt))
    deltas, _ = _stream(detok, ids)
    assert "".join(deltas) == tokenizer.decode(ids) == detok.output_text
    assert detok.output_token_ids == ids


@pytest.mark.parametrize("text", ["你好😀世界", "a😀b", "日本語のテキスト 😂 ok", "é"])
@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_multibyte_never_broken_mid_stream(
    tokenizer: PreTrainedTokenizerFast, text: str, chunks: int
) -> None:
    ids = byte_ids(tokenizer, text)
    assert len(ids) > len(text)  # really split into byte tokens
    detok = IncrementalDetokenizer(tokenizer, _request(tokenizer.encode("hello")))
    deltas, _ = _stream(detok, ids, chunks=chunks)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text
    # A 4-byte emoji split in single bytes yields nothing until its last byte arrives.
    if chunks == 1 and text == "a😀b":
        assert deltas == ["a", "", "", "", "😀", "b"]


def test_bpe_tokens_straddling_characters(tokenizer: PreTrainedTokenizerFast) -> None:
    text = " 😀😁😂 smile 😀 你好"
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, _request(tokenizer.encode("emoji")))
    deltas, _ = _stream(detok, ids)
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def test_random_byte_splits_round_trip(tokenizer: PreTrainedTokenizerFast) -> None:
    rng = random.Random(0)
    alphabet = "ab 你好😀é€ world"
    for _ in range(30):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 20)))
        ids = byte_ids(tokenizer, text)
        detok = IncrementalDetokenizer(tokenizer, _request([5, 6, 7]))
        deltas, _ = _stream(detok, ids, chunks=rng.randint(1, 4))
        assert "".join(deltas) == text
        assert all("\ufffd" not in d for d in deltas)


def test_an_incomplete_character_at_the_end_is_left_out(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """vLLM's detokenizers never release a character whose bytes did not all come: the text
    ends before it (``tokenizer.decode`` would show U+FFFD)."""
    ids = byte_ids(tokenizer, "ok😀")[:-1]  # the emoji's last byte never comes
    detok = IncrementalDetokenizer(tokenizer, _request([5]))
    deltas, _ = _stream(detok, ids)
    assert deltas[:2] == ["o", "k"]
    assert "".join(deltas) == detok.output_text == "ok"
    assert tokenizer.decode(ids) == "ok\ufffd"


@pytest.mark.parametrize("lead", ["", "hello there, "], ids=["short", "long"])
@pytest.mark.parametrize(("char", "given"), [("é", 1), ("😀", 1), ("😀", 2), ("😀", 3)])
def test_a_character_begun_at_the_prompts_end_is_completed_by_the_output(
    tokenizer: PreTrainedTokenizerFast, lead: str, char: str, given: int
) -> None:
    """A prompt may end inside a character (token ids cut mid-character): the output's first
    bytes complete it and the character is the output's first text, as vLLM's detokenizer
    (primed with the prompt) gives it."""
    cut = byte_ids(tokenizer, char)
    prompt = tokenizer.encode(lead) + cut[:given]
    ids = cut[given:] + tokenizer.encode(" ok")
    detok = IncrementalDetokenizer(tokenizer, _request(prompt))
    deltas, _ = _stream(detok, ids)
    assert "".join(deltas) == detok.output_text == char + " ok"
    assert all("\ufffd" not in d for d in deltas)


@pytest.mark.parametrize("pads", [1, 15, 16, 40])
@pytest.mark.parametrize(("char", "given"), [("é", 1), ("😀", 1), ("😀", 2), ("😀", 3)])
@pytest.mark.parametrize("where", ["prompt", "output"])
def test_skipped_special_tokens_inside_a_character_keep_its_bytes(
    tokenizer: PreTrainedTokenizerFast, pads: int, char: str, given: int, where: str
) -> None:
    """Skipped special tokens after a character's first bytes (the prompt's or the output's):
    it still comes whole; a run of them leaves the window, every byte of the character stays
    (one, two or three bytes of it decode to the same one U+FFFD)."""
    pad = tokenizer.convert_tokens_to_ids("<|pad|>")
    cut = byte_ids(tokenizer, char)
    prompt = tokenizer.encode("hello there, ") + (cut[:given] if where == "prompt" else [])
    out = ([] if where == "prompt" else cut[:given]) + [pad] * pads + cut[given:]
    detok = IncrementalDetokenizer(tokenizer, _request(prompt))
    deltas, _ = _stream(detok, out + tokenizer.encode(" ok"))
    assert "".join(deltas) == detok.output_text == char + " ok"


@pytest.mark.parametrize("lead", ["", "hello there, "], ids=["short", "long"])
@pytest.mark.parametrize("then", ["ab", "é", "😀x"])
def test_stray_bytes_at_the_prompts_end_stay_the_prompts(
    tokenizer: PreTrainedTokenizerFast, lead: str, then: str
) -> None:
    """Output that does not continue the prompt's unfinished character: its stray bytes are
    the prompt's and show nowhere; the output's text is its own tokens' (``decode``)."""
    prompt = tokenizer.encode(lead) + byte_ids(tokenizer, "😀")[:2]
    ids = byte_ids(tokenizer, then)
    detok = IncrementalDetokenizer(tokenizer, _request(prompt))
    deltas, _ = _stream(detok, ids)
    assert "".join(deltas) == detok.output_text == tokenizer.decode(ids) == then


def test_outputs_match_a_decode_stream_primed_with_the_prompt(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """Random prompts and outputs cut anywhere in their bytes, against the tokenizers library's
    own ``DecodeStream`` primed with the whole prompt (what vLLM's fast detokenizer streams):
    the same text, whole characters only in every delta but where a stray byte run is
    followed by a complete character."""
    from tokenizers.decoders import DecodeStream

    rng = random.Random(7)
    alphabet = "ab 你好😀é€ world"
    for _ in range(60):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(6, 24)))
        ids = byte_ids(tokenizer, text)
        cut = rng.randint(1, len(ids) - 1)
        prompt, out = ids[:cut], ids[cut:]
        stream = DecodeStream(skip_special_tokens=True)
        for tid in prompt:
            stream.step(tokenizer.backend_tokenizer, tid)
        expected = "".join(c for tid in out
                           if (c := stream.step(tokenizer.backend_tokenizer, tid)) is not None)
        detok = IncrementalDetokenizer(tokenizer, _request(prompt))
        deltas, _ = _stream(detok, out, chunks=rng.randint(1, 3))
        assert "".join(deltas) == detok.output_text == expected, (prompt, out)


def test_skip_special_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    eos = tokenizer.convert_tokens_to_ids("<|eos|>")
    ids = tokenizer.encode("hello") + [eos] + tokenizer.encode(" world")
    skip = IncrementalDetokenizer(tokenizer, _request([5], skip_special_tokens=True))
    keep = IncrementalDetokenizer(tokenizer, _request([5], skip_special_tokens=False))
    assert "".join(_stream(skip, ids)[0]) == "hello world"
    assert "".join(_stream(keep, ids)[0]) == "hello<|eos|> world"


@pytest.mark.parametrize("skip", [True, False], ids=["skip", "keep"])
def test_a_prompt_ending_in_special_tokens_leaks_none_into_the_output(
        tokenizer: PreTrainedTokenizerFast, skip: bool) -> None:
    """The prompt's last tokens are the decoding context of the first output tokens: with
    skip_special_tokens=False its special tokens are in that context's text too, and none of
    them may reach the output (nor may the output's own special tokens be lost)."""
    eos = tokenizer.convert_tokens_to_ids("<|eos|>")
    pad = tokenizer.convert_tokens_to_ids("<|pad|>")
    prompt = tokenizer.encode("the world") + [pad, eos]
    out = tokenizer.encode(" hello") + [eos] + tokenizer.encode(" world") + [pad]
    detok = IncrementalDetokenizer(tokenizer, _request(prompt, skip_special_tokens=skip))
    deltas, _ = _stream(detok, out)
    want = " hello world" if skip else " hello<|eos|> world<|pad|>"
    assert "".join(deltas) == detok.output_text == want


def test_long_run_of_skipped_special_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    pad = tokenizer.convert_tokens_to_ids("<|pad|>")
    ids = tokenizer.encode("hi") + [pad] * 100 + tokenizer.encode(" there")
    detok = IncrementalDetokenizer(tokenizer, _request([5]))
    assert "".join(_stream(detok, ids)[0]) == "hi there"


def test_prompt_context_keeps_the_leading_space() -> None:
    # Metaspace decoding drops the space of a sequence's first word; the prompt gives context.
    vocab = {"[UNK]": 0, "▁hello": 1, "▁world": 2, "▁again": 3}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Metaspace()
    assert tk.decode([2]) == "world"
    detok = IncrementalDetokenizer(tk, _request([1]))
    assert "".join(_stream(detok, [2, 3])[0]) == " world again"


def test_text_decoder_with_slow_decode_fn(tokenizer: PreTrainedTokenizerFast) -> None:
    calls: list[list[int]] = []

    def decode(ids: list[int], skip: bool) -> str:
        calls.append(list(ids))
        return tokenizer.decode(ids, skip_special_tokens=skip)

    dec = TextDecoder(decode, tokenizer.encode("x"), skip_special_tokens=True)
    out = "".join(dec.step(t) for t in byte_ids(tokenizer, "€uro"))
    assert out == "€uro"
    assert max(len(c) for c in calls) <= 6  # the window stays small
    assert make_decode_fn(tokenizer)([72, 73], True) == tokenizer.decode([72, 73])


def test_stop_string_spanning_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = tokenizer.encode("the stop sign is red")
    detok = IncrementalDetokenizer(tokenizer, _request([5], stop=["sign"]))
    deltas, stop = _stream(detok, ids)
    assert stop == "sign"
    assert detok.output_text == "the stop "
    assert "".join(deltas) == "the stop "


def test_stop_string_split_across_single_byte_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = byte_ids(tokenizer, "ab😀cd")
    detok = IncrementalDetokenizer(tokenizer, _request([5], stop=["😀c"]))
    deltas, stop = _stream(detok, ids)
    assert stop == "😀c"
    assert "".join(deltas) == detok.output_text == "ab"


def test_include_stop_str_in_output(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = tokenizer.encode("hello world, the quick")
    detok = IncrementalDetokenizer(
        tokenizer, _request([5], stop=["wor"], include_stop_str_in_output=True)
    )
    deltas, stop = _stream(detok, ids)
    assert stop == "wor"
    assert detok.output_text == "hello wor"
    assert "".join(deltas) == "hello wor"


def test_multiple_stop_strings_in_one_step_first_listed_wins(
        tokenizer: PreTrainedTokenizerFast) -> None:
    # vLLM's check_stop_strings: the stop list in order, each searched in the new text.
    ids = tokenizer.encode("the quick brown fox jumps")
    detok = IncrementalDetokenizer(tokenizer, _request([5], stop=["fox", "quick", "zzz"]))
    deltas, stop = _stream(detok, ids, chunks=len(ids))  # everything in one step
    assert stop == "fox"
    assert "".join(deltas) == "the quick brown "
    # Token by token "quick" comes first, and ends the request there.
    detok = IncrementalDetokenizer(tokenizer, _request([5], stop=["fox", "quick", "zzz"]))
    deltas, stop = _stream(detok, ids)
    assert stop == "quick" and "".join(deltas) == "the "


def test_streaming_never_takes_back_a_stop_string(tokenizer: PreTrainedTokenizerFast) -> None:
    text = "hello STOP there"
    ids = byte_ids(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, _request([5], stop=["STOP", "lo S"]))
    streamed = ""
    stop = None
    for tok in ids:
        stop = detok.update([tok], False)
        streamed += detok.get_next_output_text(stop is not None, delta=True)
        assert "S" not in streamed  # nothing of a forming stop string was ever sent
        if stop:
            break
    assert stop == "lo S"
    assert streamed == detok.output_text == "hel"


@pytest.mark.parametrize("stop", [["\n", "STOP"], ["STOP", "\n"]])
def test_the_hold_covers_the_longest_stop_string_wherever_it_is_listed(
    tokenizer: PreTrainedTokenizerFast, stop: list[str]
) -> None:
    """The held-back text is as long as the longest stop string less one, not the first listed:
    with a one-character stop string first, "STOP" forming byte by byte is never streamed, so
    the deltas join into the final (truncated) text."""
    detok = IncrementalDetokenizer(tokenizer, _request([5], stop=stop))
    streamed = ""
    found = None
    for tok in byte_ids(tokenizer, "hello STOP there"):
        found = detok.update([tok], False)
        streamed += detok.get_next_output_text(found is not None, delta=True)
        assert "S" not in streamed  # nothing of the forming stop string went out
        if found:
            break
    assert found == "STOP"
    assert streamed == detok.output_text == "hello "


def test_cumulative_text_holds_back_the_stop_buffer(tokenizer: PreTrainedTokenizerFast) -> None:
    detok = IncrementalDetokenizer(tokenizer, _request([5], stop=["xyz!"]))
    detok.update(tokenizer.encode("hello world"), False)
    assert detok.get_next_output_text(False, delta=False) == "hello wo"
    assert detok.get_next_output_text(True, delta=False) == "hello world"
    # Text shorter than the hold shows nothing yet (vLLM's output_text[:-buffer_length]).
    short = IncrementalDetokenizer(tokenizer, _request([5], stop=["xyz!"]))
    short.update(tokenizer.encode("ab"), False)
    assert short.get_next_output_text(False, delta=False) == ""
    assert short.get_next_output_text(False, delta=True) == ""
    assert short.get_next_output_text(True, delta=False) == "ab"


def test_stop_token_text_is_left_out(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = tokenizer.encode("hello world")
    out = IncrementalDetokenizer(tokenizer, _request([5]))
    _stream(out, ids, stop_terminated=True)
    assert out.output_text == tokenizer.decode(ids[:-1])
    assert out.output_token_ids == ids  # the token id itself is still reported
    kept = IncrementalDetokenizer(tokenizer, _request([5], include_stop_str_in_output=True))
    _stream(kept, ids, stop_terminated=True)
    assert kept.output_text == "hello world"


def test_stop_strings_ignored_within_min_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = byte_ids(tokenizer, "ab ab ab")
    detok = IncrementalDetokenizer(tokenizer, _request([5], stop=["ab"], min_tokens=3))
    deltas, stop = _stream(detok, ids)
    assert stop == "ab"
    assert "".join(deltas) == "ab "  # the first "ab" lies within min_tokens


def test_without_tokenizer_only_ids_are_tracked() -> None:
    detok = IncrementalDetokenizer(None, _request([1, 2]))
    assert detok.update([3, 4], False) is None
    assert detok.output_token_ids == [3, 4]
    assert detok.get_next_output_text(True, delta=True) == ""


@pytest.mark.parametrize(
    ("text", "new", "stop", "include", "expected"),
    [
        ("hello world", 5, ["wor"], False, ("wor", 6)),
        ("hello world", 5, ["wor"], True, ("wor", 9)),
        ("hello world", 3, ["world"], True, ("world", -1)),
        ("hello world", 2, ["hello"], False, None),  # entirely in old text: already checked
        ("hello world", 0, ["world"], False, None),
        ("abcabc", 3, ["c", "bc"], False, ("c", 5)),
        ("abcabc", 3, ["bc", "c"], False, ("bc", 4)),
        # One token completes two stop strings: the first listed wins, wherever it starts
        # (vLLM's order): "ny" leaves "x ma".
        ("x many", 5, ["ny", "man"], False, ("ny", 4)),
        ("x many", 5, ["man", "ny"], False, ("man", 2)),
        ("x many", 5, ["ny", "man"], True, ("ny", -1)),
        ("x many", 5, ["man", "ny"], True, ("man", 5)),
    ],
)
def test_find_stop_string(
    text: str, new: int, stop: list[str], include: bool, expected: tuple[str, int] | None
) -> None:
    assert find_stop_string(text, new, stop, include) == expected


def test_stop_strings_inside_min_tokens_of_one_update_do_not_count(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """Several tokens in one update: a stop string within the first min_tokens tokens does not
    end the request (vLLM), one after them does."""
    ids = byte_ids(tokenizer, "aSbS")
    detok = IncrementalDetokenizer(tokenizer, _request([5], stop=["S"], min_tokens=2))
    assert detok.update(ids[:3], stop_terminated=False) is None
    assert detok.output_text == "aSb"
    assert detok.update(ids[3:], stop_terminated=False) == "S"
    assert detok.output_text == "aSb"


def test_stop_strings_hold_text_back_unless_they_go_out_anyway(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """While unfinished, the last len(longest stop) - 1 characters are held back (they may
    begin a stop string that must not be shown); with include_stop_str_in_output nothing is
    (vLLM: a stop buffer of 0)."""
    ids = byte_ids(tokenizer, "hello wor")
    held = IncrementalDetokenizer(tokenizer, _request([5], stop=["world"]))
    held.update(ids, stop_terminated=False)
    assert held.get_next_output_text(False, delta=True) == "hello"  # " wor" may start it
    shown = IncrementalDetokenizer(tokenizer, _request([5], stop=["world"],
                                                      include_stop_str_in_output=True))
    shown.update(ids, stop_terminated=False)
    assert shown.get_next_output_text(False, delta=True) == "hello wor"


def test_a_byte_run_that_never_completes_goes_out_after_sixteen_tokens(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """Lead bytes that never complete a character are held back (they may still), but not for
    ever: at the sixteenth pending token the text goes out, replacement characters and all but
    the last (which a continuation byte may still complete)."""
    lead = byte_ids(tokenizer, "\u00e9")[:1]  # 0xC3 alone
    detok = IncrementalDetokenizer(tokenizer, _request([5]))
    lengths = []
    for _ in range(16):
        detok.update(lead, stop_terminated=False)
        lengths.append(len(detok.output_text))
    assert lengths[:15] == [0] * 15 and lengths[15] > 0
    assert set(detok.output_text) == {"\ufffd"}


@pytest.mark.parametrize("leads", [14, 15, 16, 17, 31])
def test_a_character_completing_after_a_long_byte_run_is_kept(
    tokenizer: PreTrainedTokenizerFast, leads: int
) -> None:
    """Lone lead bytes (each invalid once another follows), then a three-byte character whose
    bytes complete only after the sixteen-token bound flushed the run: the character is not
    replaced by U+FFFD; the text is tokenizer.decode's."""
    table = _bytes_to_unicode()
    run = [tokenizer.convert_tokens_to_ids(table[0xE1 + i % 14]) for i in range(leads)]
    ids = run + byte_ids(tokenizer, "\u4e2dA")
    detok = IncrementalDetokenizer(tokenizer, _request([5]))
    deltas, _ = _stream(detok, ids)
    expected = tokenizer.decode(ids)
    assert expected.endswith("\u4e2dA") and expected.count("\ufffd") == leads
    assert "".join(deltas) == detok.output_text == expected


@pytest.mark.parametrize("pads", [1, 15, 16, 40])
def test_skipped_special_tokens_inside_a_character_do_not_break_it(
    tokenizer: PreTrainedTokenizerFast, pads: int
) -> None:
    """A character's first byte, a run of special tokens that skip_special_tokens drops, then
    its other bytes: one character, as tokenizer.decode gives it."""
    pad = tokenizer.convert_tokens_to_ids("<|pad|>")
    first, *rest = byte_ids(tokenizer, "\u4e2d")
    ids = [first] + [pad] * pads + rest + byte_ids(tokenizer, "A")
    detok = IncrementalDetokenizer(tokenizer, _request([5]))
    deltas, _ = _stream(detok, ids)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "\u4e2dA"
    assert "".join(deltas) == detok.output_text == "\u4e2dA"


def _metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """SentencePiece-style (Llama 2): words carry a leading "▁" that the decoder turns into a
    space, and strips at the start of a text."""
    from tokenizers import AddedToken, normalizers

    words = ["<unk>", "<s>", "</s>", "▁", "▁Hello", "▁world", "Hello", "world"]
    tk = Tokenizer(models.BPE(vocab={w: i for i, w in enumerate(words)}, merges=[],
                              unk_token="<unk>"))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                          normalizers.Replace(" ", "▁")])
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    tk.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>",
                                                                 "<|sp|>")])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


@pytest.mark.parametrize("specials", [1, 15, 16, 40])
def test_a_run_of_skipped_special_tokens_keeps_the_words_space(specials: int) -> None:
    """Skipped special tokens add no text; however many come, the next word keeps the space
    its decoding after the prompt gives (the text tokenizer.decode of it all shows)."""
    tok = _metaspace_tokenizer()
    vocab = tok.get_vocab()
    prompt = [tok.bos_token_id, vocab["▁Hello"]]
    ids = [vocab["<|sp|>"]] * specials + [vocab["▁world"]]
    detok = IncrementalDetokenizer(tok, _request(prompt))
    deltas, _ = _stream(detok, ids)
    whole = tok.decode(prompt + ids, skip_special_tokens=True)
    assert whole == "Hello world"
    assert "".join(deltas) == whole[len(tok.decode(prompt, skip_special_tokens=True)):]


def _wordpiece_tokenizer() -> PreTrainedTokenizerFast:
    """BERT-style WordPiece: the decoder puts a space between tokens."""
    from tokenizers import AddedToken

    words = ["[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s"]
    tk = Tokenizer(models.WordPiece(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.decoder = decoders.WordPiece(prefix="##")
    tk.add_special_tokens([AddedToken("[CLS]", special=True), AddedToken("[SEP]", special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", eos_token="[SEP]")


def test_spaces_between_special_tokens_false_joins_adjacent_added_tokens() -> None:
    """vLLM: with special tokens kept and spaces_between_special_tokens False, an added token
    right after another is its bare content; other tokens keep the decoder's spacing."""
    tok = _wordpiece_tokenizer()
    vocab = tok.get_vocab()
    prompt = [vocab["hello"]]
    ids = [vocab["[CLS]"], vocab["[SEP]"], vocab["[SEP]"], vocab["world"], vocab["##s"],
           vocab["[SEP]"]]
    spaced = IncrementalDetokenizer(tok, _request(prompt, skip_special_tokens=False))
    joined = IncrementalDetokenizer(tok, _request(prompt, skip_special_tokens=False,
                                                  spaces_between_special_tokens=False))
    assert "".join(_stream(spaced, ids)[0]) == " [CLS] [SEP] [SEP] worlds [SEP]"
    assert "".join(_stream(joined, ids)[0]) == " [CLS][SEP][SEP] worlds [SEP]"
    # Skipped special tokens: the flag has nothing to join (vLLM ignores it then).
    skipped = IncrementalDetokenizer(tok, _request(prompt, spaces_between_special_tokens=False))
    assert "".join(_stream(skipped, ids)[0]) == " worlds"
