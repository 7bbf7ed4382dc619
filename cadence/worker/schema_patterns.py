"""A JSON schema's ``pattern`` as the grammar engine (xgrammar) must see it to write valid JSON.

A schema pattern constrains a string's *decoded* characters, while xgrammar matches the pattern
against the JSON text between the quotes: a literal ``"``, ``\\`` or control character in the
pattern (``^[A-Z]:\\\\[a-z]+$``, ``^a\\nb$``) comes out raw, and the output is no JSON at all
(``"C:\\dir"``); so does a class of such characters alone (``[\\t]``), and the dot and other
classes too wherever xgrammar's JSON-string matcher does not take the pattern (one with a
character past ASCII, a lazy repeat). ``json_string_pattern`` rewrites a pattern that can match
any: a required character becomes its JSON escape (``\\\\``, ``\\"``, ``\\n``, ``\\u0001``),
and the dot and every class keep only the characters a JSON string may carry raw, so every
output is valid JSON whose decoded text matches the pattern. Other patterns stay as written.
``optional_groups_counted`` writes ``(...)?`` as ``(...){0,1}`` (xgrammar lets ``(yz+)?``, and
the lazy ``(yz+)??``, skip the ``y``; it follows the counted form).
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

__all__ = ["json_string_pattern", "optional_groups_counted", "regex_char", "regex_quantifier"]

_SHORT = {0x22: '"', 0x5C: "\\", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}
_ESCAPED = frozenset([*range(0x20), 0x22, 0x5C])  # what a JSON string never carries raw
_NOT_RAW = '"\\\\\\x00-\\x1f'  # the same, inside a regex class
_FLAGS = re.IGNORECASE | re.MULTILINE | re.DOTALL | re.VERBOSE
# The spaces of both ECMAScript's \s (JSON Schema's regex dialect) and Python's, less the
# control characters; \S leaves out the spaces of either.
_SPACES = " \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
_ANY_SPACE = "\\s\\u0085\\ufeff"  # inside a class: the spaces of either
_CATEGORY = {_sre_c.CATEGORY_DIGIT: "\\d", _sre_c.CATEGORY_WORD: "\\w",
             _sre_c.CATEGORY_SPACE: _SPACES}
_NOT_CATEGORY = {_sre_c.CATEGORY_NOT_DIGIT: "\\d", _sre_c.CATEGORY_NOT_WORD: "\\w",
                 _sre_c.CATEGORY_NOT_SPACE: _ANY_SPACE}
# Inside a negated class: each category as written (\s with the spaces of either dialect).
_IN_NEGATED = {_sre_c.CATEGORY_DIGIT: "\\d", _sre_c.CATEGORY_WORD: "\\w",
               _sre_c.CATEGORY_SPACE: _ANY_SPACE, _sre_c.CATEGORY_NOT_DIGIT: "\\D",
               _sre_c.CATEGORY_NOT_WORD: "\\W", _sre_c.CATEGORY_NOT_SPACE: "\\S"}
_META = set("\\^$.|?*+()[]{}/-")


class _Unsupported(Exception):
    """A construct this rewrite does not write back (the pattern is refused)."""


def json_string_pattern(pattern: str) -> str:
    """``pattern`` written for JSON text (see the module's docstring); ``pattern`` itself where
    nothing in it can match a character JSON escapes, or where Python's parser cannot read it
    (left to the grammar engine, which refuses most such). A ValueError where it can match one
    through a construct this rewrite does not write back (inline flags, look-arounds,
    back-references): the grammar could then write the character raw."""
    try:
        tree = _sre.parse(pattern)
    except (re.error, OverflowError, RecursionError):
        return pattern
    # NOTE: "[\\^" too: xgrammar's regex-to-grammar path (a pattern with any non-ASCII
    # character) reads it as a negated class; Python's parser keeps no trace of it.
    if not (_needs_rewrite(tree) or "[\\^" in pattern):
        return pattern
    try:
        if tree.state.flags & _FLAGS:
            raise _Unsupported
        return _emit(tree)
    except _Unsupported:
        raise ValueError(
            f"pattern {pattern!r} cannot be enforced by the grammar engine (xgrammar): it may "
            "match a quote, backslash or control character, which JSON text must escape, "
            "through flags, look-arounds or back-references this engine cannot write for it."
        ) from None


def _class_items(items: list) -> tuple[bool, list]:
    if items and items[0][0] is _sre_c.NEGATE:
        return True, items[1:]
    return False, items


def _needs_rewrite(tree: Any) -> bool:
    """Whether anything in ``tree`` can match a character JSON escapes. NOTE: the dot and
    negated classes count: xgrammar leaves such characters out of them only where its
    JSON-string matcher takes the pattern (printable ASCII, constructs it supports); where it
    falls back to its plain regex grammar (any non-ASCII character, lazy repeats, ...) they come
    out raw."""
    for op, av in tree:
        if op is _sre_c.LITERAL and av in _ESCAPED:
            return True
        if op in (_sre_c.ANY, _sre_c.NOT_LITERAL):
            return True
        if op is _sre_c.IN:
            negated, items = _class_items(av)
            if negated or any(_item_escaped(op2, av2) for op2, av2 in items):
                return True
            if items and items[0] == (_sre_c.LITERAL, ord("^")):
                return True  # "[\^...": xgrammar's regex-to-grammar path reads it negated
        if op not in (_sre_c.LITERAL, _sre_c.IN, _sre_c.AT) and not _children(op, av):
            return True  # a look-around, back-reference, ...: unknown ground
        for sub in _children(op, av):
            if _needs_rewrite(sub):
                return True
    return False


def _item_escaped(op: Any, av: Any) -> bool:
    """Whether a positive class item takes a character JSON escapes."""
    if op is _sre_c.LITERAL:
        return av in _ESCAPED
    if op is _sre_c.RANGE:
        return any(av[0] <= c <= av[1] for c in _ESCAPED)
    return op is _sre_c.CATEGORY and av is not _sre_c.CATEGORY_DIGIT and (
        av is not _sre_c.CATEGORY_WORD)


def _children(op: Any, av: Any) -> list:
    if op is _sre_c.BRANCH:
        return list(av[1])
    if op is _sre_c.SUBPATTERN:
        return [av[3]]
    if op in (_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT):
        return [av[2]]
    return []


def _escape(c: int) -> str:
    """The regex for the JSON escape of code point ``c``."""
    short = _SHORT.get(c)
    return "\\\\" + (("\\" + short) if short in ('"', "\\") else (short or f"u{c:04x}"))


def regex_char(c: int, in_class: bool = False) -> str:
    """Code point ``c`` as a regex matches it (escaped where it has a meaning there; in a
    class with ``in_class``)."""
    ch = chr(c)
    if in_class:
        return "\\" + ch if ch in "\\]^-[" else _printable(c)
    return "\\" + ch if ch in _META else _printable(c)


def _printable(c: int) -> str:
    return chr(c) if chr(c).isprintable() or c > 0xFFFF else f"\\u{c:04x}"


def _escapes(chars: list[int]) -> str:
    """A regex for the JSON escapes of ``chars`` (one required character: its short form)."""
    if len(chars) == 1:
        return _escape(chars[0])
    # \\u00 and two hex digits: no character JSON escapes raw in it.
    highs = sorted({c >> 4 for c in chars})
    parts = []
    for high in highs:
        lows = "".join(f"{c & 15:x}" for c in chars if c >> 4 == high)
        parts.append(f"{high:x}" + (lows if len(lows) == 1 else f"[{lows}]"))
    return "\\\\u00" + (parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")")


def _ranges_without_escaped(lo: int, hi: int) -> list[tuple[int, int]]:
    out, start = [], lo
    for c in sorted(_ESCAPED):
        if c < start or c > hi:
            continue
        if c > start:
            out.append((start, c - 1))
        start = c + 1
    if start <= hi:
        out.append((start, hi))
    return out


def _emit_class(av: list) -> tuple[str, bool]:
    """A class, and whether a quantifier after it repeats all of it. Positive: its characters
    less those JSON escapes (a class of those alone: their escapes); negated: those left out
    too."""
    negated, items = _class_items(av)
    if negated:
        parts = [_negated_item(op, arg) for op, arg in items]
        return "[^" + "".join(_caret_not_first(parts)) + _NOT_RAW + "]", True
    plain: list[str] = []
    not_category: list[str] = []
    escaped: set[int] = set()
    for op, arg in items:
        if op is _sre_c.LITERAL:
            if arg in _ESCAPED:
                escaped.add(arg)
            else:
                plain.append(regex_char(arg, True))
        elif op is _sre_c.RANGE:
            escaped.update(c for c in _ESCAPED if arg[0] <= c <= arg[1])
            plain.extend(regex_char(a, True) if a == b
                         else f"{regex_char(a, True)}-{regex_char(b, True)}"
                         for a, b in _ranges_without_escaped(*arg))
        elif op is _sre_c.CATEGORY and arg in _CATEGORY:
            plain.append(_CATEGORY[arg])
        elif op is _sre_c.CATEGORY and arg in _NOT_CATEGORY:
            not_category.append(_NOT_CATEGORY[arg])
        else:
            raise _Unsupported
    if plain == ["\\^"] and not not_category:  # escaped characters beside it are left out
        return "\\^", True
    parts = (["[" + "".join(_caret_not_first(plain)) + "]"] if plain else []) + [
        f"[^{cat}{_NOT_RAW}]" for cat in not_category]
    if not parts:  # a class of escaped characters alone: their escapes
        return _escapes(sorted(escaped)), False
    # NOTE: the escaped characters beside others are left out: xgrammar drops an alternative
    # that holds a backslash.
    return (parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"), True


def _negated_item(op: Any, arg: Any) -> str:
    if op is _sre_c.LITERAL:
        return "" if arg in _ESCAPED else regex_char(arg, True)  # left out with the rest
    if op is _sre_c.RANGE:
        return f"{regex_char(arg[0], True)}-{regex_char(arg[1], True)}"
    if op is _sre_c.CATEGORY and arg in _IN_NEGATED:
        return _IN_NEGATED[arg]
    raise _Unsupported


def _caret_not_first(items: list[str]) -> list[str]:
    # NOTE: xgrammar's regex-to-grammar path reads "[\^" as a negated class: ^ never first.
    items = [i for i in items if i]
    if len(items) > 1 and items[0].startswith("\\^"):
        return items[1:] + items[:1]
    return items


def _emit(tree: Any) -> str:
    return "".join(_emit_node(op, av)[0] for op, av in tree)


def _emit_node(op: Any, av: Any) -> tuple[str, bool]:
    """One node's regex, and whether a quantifier after it repeats all of it."""
    if op is _sre_c.LITERAL:
        return (_escape(av), False) if av in _ESCAPED else (regex_char(av), True)
    if op is _sre_c.NOT_LITERAL:
        return f"[^{regex_char(av, True)}{_NOT_RAW}]", True
    if op is _sre_c.ANY:
        return f"[^{_NOT_RAW}]", True
    if op is _sre_c.IN:
        return _emit_class(av)
    if op is _sre_c.BRANCH:
        return "(?:" + "|".join(_emit(alt) for alt in av[1]) + ")", True
    if op is _sre_c.SUBPATTERN:
        if av[1] or av[2]:
            raise _Unsupported  # inline flags
        return "(" + _emit(av[3]) + ")", True
    if op in (_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT):
        lo, hi, sub = av
        body, atom = _emit_node(*sub[0]) if len(sub) == 1 else (_emit(sub), False)
        return (body if atom else "(?:" + body + ")") + regex_quantifier(lo, hi), False
    if op is _sre_c.AT and av in (_sre_c.AT_BEGINNING, _sre_c.AT_BEGINNING_STRING):
        return "^", False
    if op is _sre_c.AT and av in (_sre_c.AT_END, _sre_c.AT_END_STRING):
        return "$", False
    raise _Unsupported


def regex_quantifier(lo: int, hi: int) -> str:
    """The quantifier of ``lo`` to ``hi`` repeats (``{0,1}`` counted: see
    ``optional_groups_counted``)."""
    if hi is _sre_c.MAXREPEAT:
        return {0: "*", 1: "+"}.get(lo, f"{{{lo},}}")
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def optional_groups_counted(pattern: str) -> str:
    """``pattern`` with every ``)?`` (a group made optional; lazy ``)??`` too) written
    ``){0,1}``: the same strings, outside character classes and escapes."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]" or (out and out[-1] in ("[", "[^"))
        elif c == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "^":
                out.append("[^")
                i += 2
                continue
        elif c == "?" and out and out[-1] == ")" and pattern[i + 1:i + 2] != "+":
            out.append("{0,1}")
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)
