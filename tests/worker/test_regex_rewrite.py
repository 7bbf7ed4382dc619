"""A structured output's regex as the grammar engine reads it: every string the compiled grammar
takes is one Python's ``re.fullmatch`` takes, and the other way round (Python's re is the
oracle); anchors that could only match inside the text are refused, not ignored."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("xgrammar")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from xgrammar.testing import _is_grammar_accept_string as accepts  # noqa: E402

from cadence.sampling_params import StructuredOutputsParams  # noqa: E402
from cadence.worker.grammar_compiler import grammar_of  # noqa: E402
from cadence.worker.regex_rewrite import xgrammar_regex  # noqa: E402

_TEXTS = ["", "^", "^^", "^^^", "a", "aa", "aaa", "^a", "a^", "b", "ab", "ba", "x^y", "xay",
          "x^^y", "xy", "_", "`", "-", "5", "]", "\\", "abc", "^c", "bc", "ac", "[^", "abab",
          " ", "^ ", "x^x^", "^^^^", "^^^^^^", "b^"]


def _regex(pattern: str):
    return grammar_of(StructuredOutputsParams(regex=pattern))


@pytest.mark.parametrize("pattern", [
    r"x[\^]y", r"[\^a]{3}", r"^[\^]$", r"[\^-a]+", r"[\^a-c]", r"[\^\d]", r"[\x5e]b?",
    r"[\u005Eb]", r"[\136]", r"(a|[\^b])c", r"(?:[\^]|ab){2}", r"[\^\]]", r"[\^\\]",
    r"x[\^]*?y", r"[^\^]+", r"\Aab\Z", r"\A[\^a]+\Z", r"(^a|b)c", r"b(a$)?", r"(a$|b)",
    # A repeat of several items, or of a repeat, stays one group; classes keep their categories;
    # a character left out stays left out.
    r"(?:x[\^]){2}", r"(?:[\^]{2}){3}", r"(?:[\^]{2})*", r"[\^\s]+", r"[\^\S]", r"[\^\w]+",
    r"[\^\W]", r"[^a][\^b]", r"[\^][^\^b]", r"[\^]{2,}", r"[\^a]{2,3}",
])
def test_carets_first_in_a_class_and_edge_anchors_mean_what_re_means(pattern: str) -> None:
    grammar = _regex(pattern)
    wrong = [t for t in _TEXTS if accepts(grammar, t) != bool(re.fullmatch(pattern, t))]
    assert not wrong, (pattern, xgrammar_regex(pattern), wrong)


@pytest.mark.parametrize(("pattern", "anchor"), [
    ("a$b", "'$'"), ("a^b", "'^'"), (r"a\Zb", r"'\Z'"), (r"a\Ab", r"'\A'"), ("a?^b", "'^'"),
    ("(a$)+b", "'$'"), ("(^a)*", "'^'"), ("(a|b$)c", "'$'"),
])
def test_an_anchor_inside_the_text_is_refused(pattern: str, anchor: str) -> None:
    with pytest.raises(ValueError, match=f"invalid regex: the anchor {re.escape(anchor)}"):
        _regex(pattern)


def test_a_structural_tags_regex_is_rewritten_too() -> None:
    grammar = grammar_of(StructuredOutputsParams(
        structural_tag={"format": {"type": "regex", "pattern": r"[\^a]{2}"}}))
    assert accepts(grammar, "^a") and accepts(grammar, "a^")
    assert not accepts(grammar, "bb")


@pytest.mark.parametrize("pattern", [r"[a-z]+\d{2,3}", r"(ab|cd)*", r"^[^\^]+$", r"x\^y",
                                     r"(?i)[\^a]", "[ä^]"])
def test_other_patterns_stay_as_written(pattern: str) -> None:
    assert xgrammar_regex(pattern) == pattern


_ATOMS = ["a", "b", "^", r"\^", "[a^]", r"[\^a]", r"[\^]", r"[\^-b]", "[^a]", r"[^\^]", "(a|b)",
          r"(\^|b)", "[ab]", r"\d"]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from(_ATOMS), st.sampled_from(["", "?", "*", "{2}"])),
                min_size=1, max_size=4),
       st.lists(st.text(alphabet="ab^1-", max_size=5), min_size=8, max_size=8))
def test_random_patterns_agree_with_re(parts: list[tuple[str, str]], texts: list[str]) -> None:
    pattern = "".join(atom + q for atom, q in parts)
    try:
        re.compile(pattern)
    except re.error:  # not Python's regex ("^?"): xgrammar's own reading, left as it is
        return
    try:
        grammar = _regex(pattern)
    except ValueError:  # an anchor inside the text: refused, and re agrees it is one
        assert "^" in pattern
        return
    for text in texts:
        assert accepts(grammar, text) == bool(re.fullmatch(pattern, text)), (pattern, text)
