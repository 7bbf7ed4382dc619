"""The byte-level alphabet and the merge learner."""

from __future__ import annotations

import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from cadence.model.bpe import byte_symbols, learn_merges, symbol_bytes


def test_alphabet_is_the_byte_level_alphabet():
    symbols = byte_symbols()
    assert len(set(symbols)) == 256
    assert set(symbols) == set(pre_tokenizers.ByteLevel.alphabet())
    assert symbols[ord("a")] == "a" and symbols[ord(" ")] == "Ġ" and symbols[ord("\n")] == "Ċ"
    assert symbol_bytes("Ġthe") == b" the"
    assert symbol_bytes("Ã©") == "é".encode()


def test_merges_most_frequent_pair_first_with_string_order_ties():
    # "ab" appears 6 times, then "abc" 3 times; "xy" and "de" tie at 2 and "de" sorts first.
    text = "ab ab ab abc abc abc de de xy xy"
    merges = learn_merges(text, 10)
    assert merges[:2] == [("a", "b"), ("Ġ", "ab")]
    assert merges.index(("d", "e")) < merges.index(("x", "y"))
    assert learn_merges(text, 10) == merges
    assert len(learn_merges(text, 3)) == 3


def test_merges_never_cross_words_and_stop_at_singletons():
    merges = learn_merges("one two", 50)
    assert merges == []  # every pair occurs once


def test_learned_merges_drive_a_tokenizer():
    text = "the cat and the hat and the bat " * 3
    merges = learn_merges(text, 20)
    vocab = {s: i for i, s in enumerate(byte_symbols())}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    encoding = tokenizer.encode("the cat and the hat")
    assert "Ġthe" in encoding.tokens and len(encoding.ids) <= 5
    assert tokenizer.decode(encoding.ids) == "the cat and the hat"


def _recounted_merges(text: str, num_merges: int) -> list[tuple[str, str]]:
    """The merge rule applied naively: every pair counted again from scratch after each merge
    (each occurrence of a word on its own), the most frequent pair first, ties to the smallest
    pair, each merge applied left to right; no pair seen fewer than twice is merged."""
    splitter = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    words = [list(piece) for piece, _ in splitter.pre_tokenize_str(text)]
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        counts: dict[tuple[str, str], int] = {}
        for word in words:
            for pair in zip(word, word[1:]):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        if counts[best] < 2:
            break
        merges.append(best)
        for n, word in enumerate(words):
            out, i = [], 0
            while i < len(word):
                if word[i : i + 2] == list(best):
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            words[n] = out
    return merges


def test_merges_match_a_recount_from_scratch():
    # Words repeated unevenly (their counts weigh their pairs), pairs repeated inside a word
    # ("lalala", "aaaa"), punctuation and line breaks between words.
    rng = random.Random(3)
    vocab = ["lalala", "banana", "aaaa", "the", "then", "bandana", "x", "la", "nab", "an."]
    text = " ".join(rng.choice(vocab) + rng.choice(["", "", ",", "\n"]) for _ in range(400))
    for num_merges in (1, 7, 100):  # 100: past the last pair seen twice
        assert learn_merges(text, num_merges) == _recounted_merges(text, num_merges)
    assert 20 <= len(_recounted_merges(text, 100)) < 100


def test_the_first_word_gets_no_prefix_space():
    # "xy" then " xy": the pair (x, y) twice, but "Ġ" before "x" once only.
    assert learn_merges("xy xy", 5) == [("x", "y")]
