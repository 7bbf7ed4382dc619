"""A structured output's ``regex`` as the grammar engine (xgrammar) must see it to mean what
Python's ``re`` means by it, the output being matched whole.

xgrammar's regex reader (0.2.x) turns a character class into a grammar class without looking at
its first character: a class starting with a caret, however escaped (``[\\^a]``: a caret or an
``a``; the range ``[\\^-a]``), becomes a negated class (anything but ``a``). It drops the anchors
``^`` and ``$`` wherever they stand, though ``a$b`` matches nothing, and reads ``\\A`` and
``\\Z`` as the letters. ``xgrammar_regex`` leaves a pattern free of these as it is; one with a
caret first in a class, or ``\\A`` / ``\\Z``, is written again from Python's parse of it (anchors
at the edges dropped, where they mean nothing to a whole match); an anchor that could only match
inside the text is refused (ValueError), since xgrammar would ignore it. (A JSON schema's
``pattern`` has its own rewrite, ``schema_patterns``.)
"""

from __future__ import annotations

try:  # Python 3.11+
    from re import _constants as _sre_c
    from re import _parser as _sre
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_c  # type: ignore[no-redef]
    import sre_parse as _sre  # type: ignore[no-redef]

import re
from typing import Any

from cadence.worker.schema_patterns import regex_char, regex_quantifier

__all__ = ["xgrammar_regex"]

_CARET = ord("^")
# A class whose first character is a caret, written escaped (a bare one negates the class).
_CARET_FIRST = re.compile(r"\[\\(\^|x5[eE]|u005[eE]|U0000005[eE]|136)")
# Python 3.11's possessive repeats and atomic groups (absent before).
_POSSESSIVE = getattr(_sre_c, "POSSESSIVE_REPEAT", None)
_ATOMIC = getattr(_sre_c, "ATOMIC_GROUP", None)
_FLAGS = re.IGNORECASE | re.MULTILINE | re.DOTALL | re.VERBOSE
_STARTS = (_sre_c.AT_BEGINNING, _sre_c.AT_BEGINNING_STRING)
_ENDS = (_sre_c.AT_END, _sre_c.AT_END_STRING)
_CATEGORY = {_sre_c.CATEGORY_DIGIT: "\\d", _sre_c.CATEGORY_NOT_DIGIT: "\\D",
             _sre_c.CATEGORY_WORD: "\\w", _sre_c.CATEGORY_NOT_WORD: "\\W",
             _sre_c.CATEGORY_SPACE: "\\s", _sre_c.CATEGORY_NOT_SPACE: "\\S"}


class _Unsupported(Exception):
    """A construct this rewrite does not write back."""


def xgrammar_regex(pattern: str) -> str:
    """``pattern`` as xgrammar must read it (see the module's docstring); ``pattern`` itself
    where nothing in it needs a rewrite, or where Python's parser cannot read it (left to the
    grammar engine, which refuses most such)."""
    try:
        tree = _sre.parse(pattern)
    except (re.error, OverflowError, RecursionError):
        return pattern
    if tree.state.flags & _FLAGS:
        return pattern  # inline flags: xgrammar refuses them
    where = _inner_anchor(tree, True, True)
    if where is not None:
        raise ValueError(f"the anchor {where} in {pattern!r} can only match inside the text, "
                         "which the grammar engine (xgrammar) cannot enforce: the output is "
                         "matched whole, so anchors belong at its start and end only.")
    # NOTE: the text too: Python's parser folds a class of one character into that character
    # ("[\^]"), and single-character alternatives into a class ("a|[\^b]" starts with "a").
    if not (_needs_rewrite(tree) or _CARET_FIRST.search(pattern)):
        return pattern
    try:
        return _emit(tree)
    except _Unsupported:
        raise ValueError(f"{pattern!r} has a character class that starts with '^' or an "
                         r"anchor \A / \Z beside a construct the grammar engine (xgrammar) "
                         "would misread; write the caret later in the class.") from None


def _width_zero(node: Any) -> bool:
    return _sre.SubPattern(_sre.State(), [node]).getwidth()[1] == 0


def _inner_anchor(seq: Any, at_start: bool, at_end: bool) -> str | None:
    """The first anchor in ``seq`` that text could stand before (a start anchor) or after (an
    end anchor) in a whole match, named; None where there is none. ``at_start`` / ``at_end``:
    whether nothing can come before / after ``seq`` itself."""
    items = list(seq)
    zero = [_width_zero(n) for n in items]
    starts, ends = [], [False] * len(items)  # nothing can stand before / after item i
    for z in zero:
        starts.append(at_start)
        at_start = at_start and z
    for i in range(len(items) - 1, -1, -1):
        ends[i] = at_end
        at_end = at_end and zero[i]
    for (op, av), start, end in zip(items, starts, ends, strict=True):
        if op is _sre_c.AT:
            if av in _STARTS and not start:
                return "'^'" if av is _sre_c.AT_BEGINNING else "'\\A'"
            if av in _ENDS and not end:
                return "'$'" if av is _sre_c.AT_END else "'\\Z'"
        for sub, once in _children(op, av):
            found = _inner_anchor(sub, start and once, end and once)
            if found is not None:
                return found
    return None


def _children(op: Any, av: Any) -> list[tuple[Any, bool]]:
    """Sub-sequences, each with whether it is matched at most once where it stands."""
    if op is _sre_c.BRANCH:
        return [(alt, True) for alt in av[1]]
    if op is _sre_c.SUBPATTERN:
        return [(av[3], True)]
    if op in (_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT, _POSSESSIVE):
        return [(av[2], av[1] <= 1)]
    if op in (_sre_c.ASSERT, _sre_c.ASSERT_NOT):
        return [(av[1], True)]
    if op is _ATOMIC and _ATOMIC is not None:
        return [(av, True)]
    return []


def _needs_rewrite(seq: Any) -> bool:
    for op, av in seq:
        if op is _sre_c.AT and av in (_sre_c.AT_BEGINNING_STRING, _sre_c.AT_END_STRING):
            return True
        if op is _sre_c.IN and av and av[0][0] is not _sre_c.NEGATE and (
                av[0] == (_sre_c.LITERAL, _CARET)
                or (av[0][0] is _sre_c.RANGE and av[0][1][0] == _CARET)):
            return True
        if any(_needs_rewrite(sub) for sub, _ in _children(op, av)):
            return True
    return False


def _emit(seq: Any) -> str:
    return "".join(_emit_node(op, av) for op, av in seq)


def _emit_node(op: Any, av: Any) -> str:
    if op is _sre_c.LITERAL:
        return regex_char(av)
    if op is _sre_c.NOT_LITERAL:
        return f"[^{regex_char(av, True)}]"
    if op is _sre_c.ANY:
        return "."
    if op is _sre_c.AT:
        return ""  # at an edge (_inner_anchor): nothing to a whole match
    if op is _sre_c.IN:
        return _emit_class(av)
    if op is _sre_c.BRANCH:
        return "(" + "|".join(_emit(alt) for alt in av[1]) + ")"
    if op is _sre_c.SUBPATTERN:
        if av[1] or av[2]:
            raise _Unsupported  # inline flags
        return "(" + _emit(av[3]) + ")"
    if op in (_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT):
        lo, hi, sub = av
        body = _emit(sub)
        if len(sub) != 1 or sub[0][0] in (_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT):
            body = "(" + body + ")"
        lazy = "?" if op is _sre_c.MIN_REPEAT else ""
        return body + regex_quantifier(lo, hi) + lazy
    raise _Unsupported  # look-arounds, back-references, ...: xgrammar has none


def _emit_class(av: list) -> str:
    negated = bool(av) and av[0][0] is _sre_c.NEGATE
    parts: list[str] = []
    caret = False
    for op, arg in av[1:] if negated else av:
        if op is _sre_c.LITERAL:
            if arg == _CARET:
                caret = True
            else:
                parts.append(regex_char(arg, True))
        elif op is _sre_c.RANGE:
            lo, hi = arg
            if lo <= _CARET <= hi:  # the caret alone, after the rest
                caret = True
                pieces = [(lo, _CARET - 1), (_CARET + 1, hi)]
            else:
                pieces = [(lo, hi)]
            for a, b in pieces:
                if a < b:
                    parts.append(f"{regex_char(a, True)}-{regex_char(b, True)}")
                elif a == b:
                    parts.append(regex_char(a, True))
        elif op is _sre_c.CATEGORY and arg in _CATEGORY:
            parts.append(_CATEGORY[arg])
        else:
            raise _Unsupported
    if caret:
        if not parts and not negated:
            return "\\^"  # a class of the caret alone: the character itself
        parts.append("\\^")  # NOTE: never first (see the module's docstring)
    return ("[^" if negated else "[") + "".join(parts) + "]"
