"""JSON values against the schema keywords that say what a value may be: its type, bounds,
lengths, pattern (``value_meets``). An ``enum`` beside such keywords is kept to the values that
meet them before the grammar is built (xgrammar reads the values alone)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["VALUE_CHECKED", "json_type", "json_type_matches", "types_meet", "value_meets"]


# Keywords beside an enum / const that its values are checked against (``value_meets``).
VALUE_CHECKED = frozenset({
    "type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minLength", "maxLength", "pattern", "minItems", "maxItems", "minProperties",
    "maxProperties", "required"})


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _multiple(value: int | float, step: int | float) -> bool:
    if isinstance(value, int) and isinstance(step, int):
        return value % step == 0
    try:
        return (value / step).is_integer()
    except OverflowError:
        return False


def value_meets(value: Any, schema: dict[str, Any]) -> bool:
    """Whether ``value`` meets the ``VALUE_CHECKED`` keywords of ``schema`` (JSON Schema's
    meaning: each applies to values of its own type only)."""
    if "type" in schema and not json_type_matches(value, schema["type"]):
        return False
    get = schema.get
    if _number(value):
        for key, holds in (("minimum", lambda b: value >= b), ("maximum", lambda b: value <= b),
                           ("exclusiveMinimum", lambda b: value > b),
                           ("exclusiveMaximum", lambda b: value < b),
                           ("multipleOf", lambda b: b > 0 and _multiple(value, b))):
            if _number(get(key)) and not holds(get(key)):
                return False
    elif isinstance(value, str):
        if _number(get("minLength")) and len(value) < get("minLength"):
            return False
        if _number(get("maxLength")) and len(value) > get("maxLength"):
            return False
        if isinstance(get("pattern"), str):
            try:
                if re.search(get("pattern"), value) is None:
                    return False
            except re.error:
                return False  # a pattern Python cannot read: the value is not shown to meet it
    elif isinstance(value, (list, dict)):
        low, high = ("minItems", "maxItems") if isinstance(value, list) else (
            "minProperties", "maxProperties")
        if _number(get(low)) and len(value) < get(low):
            return False
        if _number(get(high)) and len(value) > get(high):
            return False
        required = get("required")
        if isinstance(value, dict) and isinstance(required, list) and not all(
                k in value for k in required if isinstance(k, str)):
            return False
    return True


def json_type_matches(value: Any, kind: Any) -> bool:
    """Whether ``value`` is of the JSON type(s) ``kind`` (a name or a list of names)."""
    kinds = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()
    return types_meet({json_type(value)}, kinds) and not (
        json_type(value) == "number" and kinds & {"integer", "number"} == {"integer"})


def json_type(value: Any) -> str:
    """A parsed JSON value's type name (a whole float is an integer, as JSON Schema says)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "integer" if float(value).is_integer() else "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "other")


def types_meet(a: set[str], b: set[str]) -> bool:
    """Whether some value has a type of each set (an integer is a number)."""
    return bool(a & b) or ("integer" in a and "number" in b) or ("number" in a and "integer" in b)
