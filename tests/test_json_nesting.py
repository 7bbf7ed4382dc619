"""Nesting depth of JSON values and texts, without recursion."""

from __future__ import annotations

import json

import pytest

from cadence.json_nesting import MAX_JSON_DEPTH, nesting_depth
from cadence.sampling_params import StructuredOutputsParams


@pytest.mark.parametrize("value", [
    1, "x", None, {}, [], {"a": 1}, [[1], [2, [3]]], {"a": {"b": [{"c": []}]}},
    {"k": "[[[{{{"}, ["]", {"x": "}\\\"{"}],
])
def test_depth_of_values_and_of_their_text_agree(value):
    want = _recursive_depth(value)
    assert nesting_depth(value) == want
    assert nesting_depth(json.dumps(value)) == want


def _recursive_depth(value) -> int:  # the obvious definition, for small values
    if isinstance(value, dict):
        return 1 + max((_recursive_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_recursive_depth(v) for v in value), default=0)
    return 0


def test_deep_values_do_not_recurse():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert nesting_depth(deep) == 100_001
    assert nesting_depth("[" * 100_000) == 100_000


def test_schemas_past_the_bound_are_refused():
    schema: dict = {"type": "string"}
    while nesting_depth(schema) <= MAX_JSON_DEPTH:
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(ValueError, match="nests deeper"):
        StructuredOutputsParams(json=schema)
    with pytest.raises(ValueError, match="nests deeper"):
        StructuredOutputsParams(json=json.dumps(schema))
    StructuredOutputsParams(json=schema["properties"]["a"])  # one level less: accepted
