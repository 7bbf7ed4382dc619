"""argparse value types shared by the command lines: counts with vLLM's suffixes, bounded
integers and lists of them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from fractions import Fraction

from cadence.config import AUTO_MAX_MODEL_LEN

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def human_readable_int(text: str) -> int:
    """vLLM's token counts: an integer, or a number with a suffix (k / m / g / t: powers of
    1000, K / M / G / T: of 1024, a whole number before those; ``25.6k`` = 25600); the result
    must be a whole number."""
    text = text.strip()
    unit = text[-1:] if text[-1:] in _DECIMAL or text[-1:] in _BINARY else ""
    if not unit:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    number = text[:-1]
    scale = _DECIMAL.get(unit) or _BINARY[unit]
    try:
        value = Fraction(number) * scale
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(
            f"expected an integer or a number with a k/m/g/t/K/M/G/T suffix, got {text!r}"
        ) from None
    if unit in _BINARY and "." in number:  # vLLM's: no 1.5K
        raise argparse.ArgumentTypeError(
            f"decimals are not taken with binary suffixes like {unit}, got {text!r}: did you "
            f"mean {number}{unit.lower()}?")
    if value.denominator != 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens")
    return int(value)


def human_readable_int_or_auto(text: str) -> int:
    """``human_readable_int``, or -1 for "auto" / "-1" (vLLM's ``--max-model-len auto``: the
    context the KV cache holds, at most the model's)."""
    if text.strip().lower() in ("auto", str(AUTO_MAX_MODEL_LEN)):
        return AUTO_MAX_MODEL_LEN
    return human_readable_int(text)


def int_at_least(low: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low`` (``why`` says why, in the error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {low}{f' ({why})' if why else ''}, got {text!r}")
        return value
    return parse


def int_list_at_least(low: int) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated integers, each at least ``low``."""
    one = int_at_least(low)

    def parse(text: str) -> list[int]:
        return [one(part.strip()) for part in text.split(",")]
    return parse


def int_or_none(text: str) -> int | None:
    """An argparse ``type``: an integer, or None for "None" (vLLM's optional values, e.g.
    ``--seed None``: a random seed)."""
    if text.strip().lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or None, got {text!r}") from None
