"""Streamed text and the tags in it: how much of a piece's end may be the start of a tag, and so
must be held back until the next piece shows what it is (reasoning and tool-call parsers)."""

from __future__ import annotations


def tag_prefix_len(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
