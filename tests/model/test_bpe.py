"""The byte-level alphabet and the merge learner."""

from __future__ import annotations

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
