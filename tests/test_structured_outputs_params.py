"""A structured-outputs spec is checked when it is built: one grammar, well-formed options."""

from __future__ import annotations

import pytest

from cadence.json_nesting import MAX_JSON_DEPTH
from cadence.structured_outputs_params import StructuredOutputsParams


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_exactly_one_grammar() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", grammar="root ::= \"a\"")
    # json_object=False names no grammar: it sits beside another one.
    assert StructuredOutputsParams(regex="a+", json_object=False).regex == "a+"
    assert StructuredOutputsParams(json_object=True).json_object is True


@pytest.mark.parametrize("choice", [[], [""], ["yes", ""], ["yes", 1]])
def test_a_choice_is_non_empty_strings(choice: list) -> None:
    with pytest.raises(ValueError, match="choice must be non-empty strings"):
        StructuredOutputsParams(choice=choice)


def test_reasoning_tags_are_two_distinct_token_ids() -> None:
    spec = StructuredOutputsParams(regex="a", reasoning_tags=[0, 5])
    assert spec.reasoning_tags == (0, 5) and isinstance(spec.reasoning_tags, tuple)
    for bad in ((4, 4), (True, 2), (-1, 2), (1, 2, 3), (1,), "ab", (1.0, 2)):
        with pytest.raises(ValueError, match="reasoning_tags must be two distinct"):
            StructuredOutputsParams(regex="a", reasoning_tags=bad)


@pytest.mark.parametrize("name", ["disable_any_whitespace", "disable_fallback",
                                  "disable_additional_properties"])
def test_the_options_are_bools(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a bool"):
        StructuredOutputsParams(regex="a", **{name: 1})
    assert getattr(StructuredOutputsParams(regex="a", **{name: True}), name) is True


def test_whitespace_pattern_and_structural_tag_types() -> None:
    with pytest.raises(ValueError, match="whitespace_pattern must be a string"):
        StructuredOutputsParams(regex="a", whitespace_pattern=3)
    assert StructuredOutputsParams(regex="a", whitespace_pattern="[ ]?").whitespace_pattern
    with pytest.raises(ValueError, match="structural_tag must be JSON text or a dict"):
        StructuredOutputsParams(structural_tag=["a"])


def test_nesting_is_bounded_at_the_limit() -> None:
    deep, limit = _nested(MAX_JSON_DEPTH + 1), _nested(MAX_JSON_DEPTH)
    StructuredOutputsParams(json=limit)
    StructuredOutputsParams(structural_tag=limit)
    with pytest.raises(ValueError, match="JSON schema nests deeper"):
        StructuredOutputsParams(json=deep)
    with pytest.raises(ValueError, match="structural tag nests deeper"):
        StructuredOutputsParams(structural_tag=deep)
    text = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    with pytest.raises(ValueError, match="JSON schema nests deeper"):
        StructuredOutputsParams(json=text)
