"""GPT-2's byte-to-character table: the characters a byte-level BPE vocabulary spells bytes in.

Shared by the server's token bytes (a token's own bytes for logprobs) and the engine's prompt
bound (whether a byte-level vocabulary can spell every byte).
"""

from __future__ import annotations

import functools

__all__ = ["byte_level_table"]


@functools.cache
def byte_level_table() -> dict[str, int]:
    """GPT-2's character for each byte, inverted: the printable Latin-1 bytes stand for
    themselves, the other 68 take the characters from U+0100 on, in byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)}
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table
