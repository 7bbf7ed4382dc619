"""Byte-level BPE: the byte-to-symbol alphabet and a small deterministic merge learner."""

from __future__ import annotations

from collections import Counter, defaultdict
from functools import lru_cache

from tokenizers import pre_tokenizers


@lru_cache(maxsize=1)
def byte_symbols() -> tuple[str, ...]:
    """The printable stand-in character of each byte value (the GPT-2 byte-level alphabet).

    Bytes that are visible Latin-1 characters stand for themselves; the others (control bytes,
    space, a few Latin-1 gaps) are shifted to code points 256, 257, ... in byte order.
    """
    visible = set(range(ord("!"), ord("~") + 1))
    visible |= set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), ord("ÿ") + 1))
    symbols: list[str] = []
    shifted = 0
    for b in range(256):
        if b in visible:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return tuple(symbols)


def symbol_bytes(token: str) -> bytes:
    """The raw bytes a byte-level token string stands for."""
    table = {s: b for b, s in enumerate(byte_symbols())}
    return bytes(table[ch] for ch in token)


def learn_merges(text: str, num_merges: int) -> list[tuple[str, str]]:
    """Learn up to ``num_merges`` merges from ``text``, most frequent pair first.

    Words come from the ByteLevel pre-tokenizer (the same split the tokenizer applies), so merges
    never cross word boundaries. Ties between equally frequent pairs go to the smallest pair in
    string order, so the result depends only on the text.
    """
    splitter = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    word_counts = Counter(piece for piece, _ in splitter.pre_tokenize_str(text))
    words = [list(word) for word in word_counts]
    counts = list(word_counts.values())

    pair_counts: Counter[tuple[str, str]] = Counter()
    pair_words: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for index, word in enumerate(words):
        for pair in _pairs(word):
            pair_counts[pair] += counts[index]
            pair_words[pair].add(index)

    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges and pair_counts:
        best = min(pair_counts, key=lambda p: (-pair_counts[p], p))
        if pair_counts[best] < 2:
            break
        merges.append(best)
        merged = best[0] + best[1]
        for index in sorted(pair_words.pop(best, ())):
            word = words[index]
            for pair in _pairs(word):
                pair_counts[pair] -= counts[index]
                if pair_counts[pair] <= 0:
                    del pair_counts[pair]
            words[index] = word = _merge_word(word, best, merged)
            for pair in _pairs(word):
                pair_counts[pair] += counts[index]
                pair_words[pair].add(index)
        pair_counts.pop(best, None)
    return merges


def _pairs(word: list[str]) -> list[tuple[str, str]]:
    return [(word[i], word[i + 1]) for i in range(len(word) - 1)]


def _merge_word(word: list[str], pair: tuple[str, str], merged: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(merged)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out
