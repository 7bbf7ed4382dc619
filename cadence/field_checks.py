"""Checks of request fields shared by the parameter classes: integers that are not booleans,
token-id lists checked at C speed, containers taken as lists with a ValueError naming the
field."""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["INT64_MAX", "INT64_MIN", "as_list", "first_bad_id", "is_int", "is_real", "unique"]

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def as_list(name: str, value: object, strings_ok: bool = False, what: str = "a list") -> list:
    """``value`` as a list, or a ValueError naming the field (``strings_ok``: a string is a
    list of its characters, as vLLM takes bad_words)."""
    if (not isinstance(value, Iterable) or isinstance(value, (bytes, Mapping))
            or (isinstance(value, str) and not strings_ok)):
        raise ValueError(f"{name} must be {what}, got {type(value).__name__}.")
    return list(value)


def unique(items: list) -> list:
    """``items`` (checked: hashable) with repeats dropped, first occurrences in order (vLLM's
    ``dict.fromkeys``)."""
    return list(dict.fromkeys(items))


def first_bad_id(ids: list[Any]) -> object | None:
    """The first item of ``ids`` that is not a token id (an integer in [0, 2**63)), or None.
    Lists of plain ints (a request's millions of ids) are checked at C speed."""
    if all(type(t) is int for t in ids):
        if ids and (min(ids) < 0 or max(ids) > INT64_MAX):
            return next(t for t in ids if not 0 <= t <= INT64_MAX)
        return None
    return next((t for t in ids if not is_int(t) or not 0 <= t <= INT64_MAX), None)


def is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)
