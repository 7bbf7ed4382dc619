"""value_meets: whether an enum / const value meets the keywords beside it, as JSON Schema says
(each keyword applies to values of its own type only). Every case is checked against
jsonschema's validator as well as the expected answer written here."""

from __future__ import annotations

from typing import Any

import pytest

from cadence.worker.schema_values import value_meets

jsonschema = pytest.importorskip("jsonschema")

CASES: list[tuple[dict[str, Any], Any, bool]] = [
    # Exclusive bounds leave the bound itself out; inclusive ones keep it.
    ({"exclusiveMinimum": 2}, 2, False),
    ({"exclusiveMinimum": 2}, 2.5, True),
    ({"exclusiveMaximum": 2}, 2, False),
    ({"minimum": 2, "maximum": 2}, 2, True),
    # multipleOf with a fractional step: 2 / 0.1 is 20 (JSON Schema divides).
    ({"multipleOf": 0.1}, 2, True),
    ({"multipleOf": 0.5}, 1.5, True),
    ({"multipleOf": 0.5}, 1.2, False),
    # Item / property counts: the limits themselves are allowed.
    ({"maxItems": 2}, [1, 2], True),
    ({"maxItems": 2}, [1, 2, 3], False),
    ({"minItems": 2}, [1, 2], True),
    ({"maxProperties": 1}, {"a": 1}, True),
    ({"minProperties": 2}, {"a": 1}, False),
    ({"minLength": 2, "maxLength": 2}, "ab", True),
    # required: every listed key; only objects are held to it.
    ({"required": ["a", "b"]}, {"a": 1}, False),
    ({"required": ["a", "b"]}, {"a": 1, "b": None}, True),
    ({"required": ["a"]}, [1], True),
    # Types: a whole float is an integer, an integer is a number, a boolean is not a number.
    ({"type": "integer"}, 1.0, True),
    ({"type": "integer"}, 1.5, False),
    ({"type": "number"}, 2, True),
    ({"type": ["integer", "null"]}, None, True),
    ({"type": "number"}, True, False),
    ({"minimum": 5}, True, True),
    ({"maximum": 0}, False, True),
    # pattern is searched for anywhere in the string, not anchored.
    ({"pattern": "ab"}, "xaby", True),
    ({"pattern": "^ab"}, "xab", False),
    ({"pattern": "b$"}, "ab", True),
]


@pytest.mark.parametrize(("schema", "value", "expected"), CASES)
def test_value_meets_the_keywords_as_json_schema_says(schema: dict[str, Any], value: Any,
                                                      expected: bool) -> None:
    assert jsonschema.Draft202012Validator(schema).is_valid(value) is expected
    assert value_meets(value, schema) is expected


def test_a_pattern_python_cannot_read_is_not_shown_to_be_met() -> None:
    # jsonschema raises for it; an enum value is then kept only where it is shown to meet it.
    assert value_meets("a", {"pattern": r"\p{L}"}) is False
    assert value_meets(3, {"pattern": r"\p{L}"}) is True  # a pattern applies to strings only
