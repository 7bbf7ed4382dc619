"""Schema patterns written for JSON text: every string the compiled grammar takes is valid JSON
whose decoded text the pattern, as the caller wrote it, matches (checked with json and re)."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("xgrammar")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from xgrammar.testing import _is_grammar_accept_string as accepts  # noqa: E402

from cadence.sampling_params import StructuredOutputsParams  # noqa: E402
from cadence.worker.grammar_compiler import grammar_of  # noqa: E402
from cadence.worker.schema_patterns import json_string_pattern  # noqa: E402

_ESCAPED = {*map(chr, range(0x20)), '"', "\\"}


def _grammar(pattern: str):
    return grammar_of(StructuredOutputsParams(json={"type": "string", "pattern": pattern}))


def _candidates(value: str) -> list[str]:
    """JSON texts of ``value``: raw (invalid where it holds an escaped character), json's short
    escapes, every escaped character as \\u00XX."""
    uniform = "".join(f"\\u{ord(c):04x}" if c in _ESCAPED else c for c in value)
    return ['"' + value + '"', json.dumps(value, ensure_ascii=False), '"' + uniform + '"']


def _check_taken(grammar, pattern: str, value: str) -> bool:
    """Every candidate text the grammar takes decodes to a string ``pattern`` matches; whether
    any was taken."""
    taken = False
    for text in _candidates(value):
        if accepts(grammar, text):
            decoded = json.loads(text)  # raises for a raw quote, backslash or control character
            assert re.search(pattern, decoded), (pattern, text)
            taken = True
    return taken


@pytest.mark.parametrize(("pattern", "value"), [
    (r"^[A-Z]:\\[a-z]{1,5}$", "C:\\dir"),  # a Windows path
    (r'^\"$', '"'),
    (r'^say "hi"$', 'say "hi"'),
    (r"^a\nb$", "a\nb"),
    (r"^x\x01y$", "x\x01y"),
    (r"^[\t]+$", "\t\t"),
    (r'^["\\]{2}$', '"\\'),
    (r"^[\t\n]{1,3}$", "\n\t"),
    (r'^x\"{2,3}y$', 'x"""y'),
    (r'^"[^\W_]+"$', '"ab"'),
    (r"^\\n é$", "\\n é"),
    (r"^a\x08b\x0c$", "a\bb\f"),  # JSON's short escapes: \b backspace, \f form feed
    (r'^x\"{2,}y$', 'x"""y'),  # at least two, not exactly two
])
def test_a_pattern_that_needs_escapes_takes_its_values_as_valid_json(pattern: str,
                                                                     value: str) -> None:
    assert re.search(pattern, value)  # the value is one the pattern matches
    assert json_string_pattern(pattern) != pattern
    assert _check_taken(_grammar(pattern), pattern, value)


@pytest.mark.parametrize(("pattern", "value", "refused"), [
    (r"^.{1,3}$", "abc", 'a"c'),
    (r"^[ -~]+$", "a b~", 'a"b'),
    (r"^[^@]+@[^@]+$", "me@x", 'm"e@x'),
    (r"^[\w\s]+$", "a b", "a\tb"),
    # With a character past ASCII xgrammar no longer keeps them out of the dot and negated
    # classes itself (its JSON-string matcher takes printable ASCII only): written out here.
    (r"^.+ €$", "ab €", 'a" €'),
    (r"^[^<>]+ – [^<>]+$", "a – b", 'a"b – c'),
    (r"^[^é]$", "a", '"'),
    (r"^[\^\s\u00e9]+$", "^ é", "a"),
    (r"^[\^a]é$", "^é", "xé"),
    (r"^[\^]é$", "^é", "xé"),
    (r"^[ -~]+ é$", "a b~ é", 'a"b\\ é'),  # a range around the quote and the backslash
])
def test_classes_never_give_a_character_json_escapes(pattern: str, value: str,
                                                     refused: str) -> None:
    """Classes and the dot take the characters a string carries raw; the others are left out
    (an output is still valid: a part of what the pattern allows)."""
    grammar = _grammar(pattern)
    assert _check_taken(grammar, pattern, value)
    _check_taken(grammar, pattern, refused)


@pytest.mark.parametrize(("pattern", "taken", "refused"), [
    (r"^x(yz+)?$", "xyzz", "xz"),
    (r"^x(yz+)??$", "xyz", "xz"),  # lazy: the same strings
    (r"^\[(yz+)?$", "[yz", "[z"),  # after an escaped bracket, which opens no class
    (r"^(y[)]z)?$", "y)z", "z"),
])
def test_an_optional_group_is_all_or_nothing(pattern: str, taken: str, refused: str) -> None:
    """xgrammar's regex reading of ``(yz+)?`` can skip the ``y`` alone: the grammar takes what
    Python's re takes of the pattern, and refuses the rest."""
    assert re.search(pattern, taken) and not re.search(pattern, refused)
    grammar = _grammar(pattern)
    assert accepts(grammar, json.dumps(taken)) and not accepts(grammar, json.dumps(refused))


@pytest.mark.parametrize("pattern", [r"^[a-z]+$", r"^\d{3}-\d{4}$", r"^(ab)?c$",
                                     r"^[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}$", r"(?i)^ab$",
                                     r"^[a-", r"^\p{L}+$"])
def test_patterns_without_escaped_characters_stay_as_written(pattern: str) -> None:
    """Only a pattern that can match a character JSON escapes is rewritten (the dot, negated
    classes, such characters); one Python cannot parse stays as it is."""
    assert json_string_pattern(pattern) == pattern


@pytest.mark.parametrize("pattern", [r'(?i)^a"$', r'^(?=a)"$', r"(?s)^é.$", r"^(?=a)a$",
                                     r"^(?!\d)\w+$"])
def test_look_arounds_and_escapes_beside_flags_are_refused(
        pattern: str) -> None:
    with pytest.raises(ValueError, match="cannot be enforced"):
        json_string_pattern(pattern)
    with pytest.raises(ValueError, match="cannot be enforced"):
        _grammar(pattern)


_PIECES = ["a", "b", '"', "\\\\", "\\n", "\\t", "\\x01", ".", '[a"]', "[\\t\\n]", "[ -~]",
           "[^a]", "\\d", "\\s", '(a|")', '(x\\")', "[\\\\b]", "é", "[^é]", "[\\^a]", "\\S",
           "[\\W_]"]
_QUANTIFIERS = ["", "", "?", "*", "{1,2}", "+"]


@st.composite
def _pattern_and_value(draw):
    pieces = draw(st.lists(st.tuples(st.sampled_from(_PIECES), st.sampled_from(_QUANTIFIERS)),
                           min_size=1, max_size=4))
    pattern = "^" + "".join(p if not q else f"(?:{p}){q}" for p, q in pieces) + "$"
    value = draw(st.from_regex(pattern, fullmatch=True))
    return pattern, value


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pattern_and_value())
def test_random_patterns_never_take_invalid_json(case: tuple[str, str]) -> None:
    """Whatever the grammar takes of a value's JSON texts decodes to a match of the pattern
    (raw quotes, backslashes and control characters never pass)."""
    pattern, value = case
    _check_taken(_grammar(pattern), pattern, value)
