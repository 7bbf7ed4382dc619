"""Schemas as the grammar sees them: keywords xgrammar would drop are rewritten into ones it
enforces, or refused naming them; the outputs validate under the schema as written (jsonschema,
independently of xgrammar)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")
from xgrammar.testing import _is_grammar_accept_string as accepts  # noqa: E402

from cadence import LLM, SamplingParams  # noqa: E402
from cadence.sampling_params import StructuredOutputsParams  # noqa: E402
from cadence.worker.grammar_compiler import grammar_of  # noqa: E402
from cadence.worker.schema_features import unenforced_keyword  # noqa: E402
from tests.tiny import tiny_args  # noqa: E402


def _grammar(schema: dict):
    return grammar_of(StructuredOutputsParams(json=schema))


def _taken(schema: dict, values: list) -> list:
    grammar = _grammar(schema)
    return [v for v in values if accepts(grammar, json.dumps(v))]


def test_untyped_bounds_apply_to_the_values_they_constrain() -> None:
    """{"minimum": 1} alone: xgrammar read it as any JSON; now only the numbers in range (a
    string would be valid too, but a part of what the schema allows is what is written)."""
    values = [0, 1, 3, 5, 6, 11, 2.5, "x", None, [1], {"a": 1}]
    assert _taken({"minimum": 1, "maximum": 5}, values) == [1, 3, 5, 2.5]
    assert _taken({"maxLength": 2}, ["", "ab", "abc", 7]) == ["", "ab"]
    schema = {"type": "object", "properties": {"n": {"exclusiveMaximum": 3}}, "required": ["n"],
              "additionalProperties": False}
    assert _taken(schema, [{"n": 2}, {"n": 3}, {"n": "x"}]) == [{"n": 2}]
    for value in _taken({"minimum": 1, "maxLength": 2}, [0, 1, 9, "", "ab", "abc"]):
        jsonschema.validate(value, {"minimum": 1, "maxLength": 2})


def test_an_enum_keeps_the_values_that_meet_the_keywords_beside_it() -> None:
    assert _taken({"type": "integer", "enum": [1.5, 2, "2"]}, [1.5, 2, "2"]) == [2]
    assert _taken({"type": ["string", "null"], "enum": ["a", 1, None]}, ["a", 1, None]) == [
        "a", None]
    values = ["ok", "too-long", "no", 7]
    assert _taken({"type": "string", "enum": values, "maxLength": 3}, values) == ["ok", "no"]
    values = [1, 3, 6, 9, 12, 13, "x"]
    schema = {"enum": values, "minimum": 2, "exclusiveMaximum": 12, "multipleOf": 3}
    assert _taken(schema, values) == [3, 6, 9, "x"]  # bounds apply to numbers only
    for value in _taken(schema, values):
        jsonschema.validate(value, schema)
    schema = {"enum": ["ab", "b9", "zz"], "pattern": "^[a-z]+$", "minLength": 2}
    assert _taken(schema, ["ab", "b9", "zz"]) == ["ab", "zz"]
    # Checked against the pattern as written, not as rewritten for JSON text (it was emptied).
    values = ["C:\\x", "D:\\y", 'a"b']
    schema = {"type": "string", "enum": values, "pattern": r'^(C:\\x|a"b)$'}
    assert _taken(schema, values) == ["C:\\x", 'a"b']


def test_a_subschema_used_in_several_places_is_rewritten_once() -> None:
    """The same dict under two properties (usual in Python): its pattern is written for JSON
    text once, not escaped twice."""
    path = {"type": "string", "pattern": r"^C:\\[a-z]{1,3}$"}
    schema = {"type": "object", "properties": {"a": path, "b": path}, "required": ["a", "b"],
              "additionalProperties": False}
    value = {"a": "C:\\ab", "b": "C:\\x"}
    assert _taken(schema, [value, {"a": "C:\\\\ab", "b": "C:\\x"}]) == [value]
    jsonschema.validate(value, schema)
    assert path["pattern"] == r"^C:\\[a-z]{1,3}$"  # the caller's schema untouched


def test_hostnames_keep_to_the_label_length() -> None:
    values = ["a", "a" * 63, "a" * 64, "x." + "b" * 63 + ".io", "-a", "a-", "a-b.c", "a..b"]
    assert _taken({"type": "string", "format": "hostname"}, values) == [
        "a", "a" * 63, "x." + "b" * 63 + ".io", "a-b.c"]


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"type": "string", "enum": ["ok", "x"], "format": "email"}, "enum beside constraints"),
    ({"type": "integer", "const": 0, "minimum": 1}, "const with no value that meets"),
    ({"type": "string", "const": 5}, "const with no value that meets"),
    ({"type": "integer", "enum": ["a"]}, "enum with no value"),
    ({"type": "string", "enum": ["too-long"], "maxLength": 3}, "enum with no value"),
    ({"$defs": {"i": {"type": "integer"}}, "$ref": "#/$defs/i", "minimum": 1}, "$ref beside"),
    ({"$defs": {"b": {"type": "object", "properties": {"id": {"type": "integer"}}}},
      "$ref": "#/$defs/b", "properties": {"name": {"type": "string"}}, "required": ["name"]},
     "$ref beside"),
    ({"$defs": {"i": {"$anchor": "num", "type": "integer"}}, "$ref": "#num"}, "$ref '#num'"),
    ({"$ref": "http://example.com/s.json"}, "only local references"),
    ({"$dynamicRef": "#x"}, "$dynamicRef"),
    ({"type": []}, "type []"),
    ({"multipleOf": 5}, "multipleOf"),
    ({"uniqueItems": True}, "uniqueItems"),
    ({"type": "string", "format": "made-up"}, "format 'made-up'"),
    ({"maxLength": 3, "pattern": "^a+$"}, "minLength/maxLength beside"),
    ({"oneOf": [{"const": 0}, {"const": -0.0}]}, "oneOf whose branches may overlap"),
])
def test_what_the_grammar_would_drop_is_refused_naming_it(schema: dict, keyword: str) -> None:
    found = unenforced_keyword(schema)
    assert found is not None and keyword in found, found
    with pytest.raises(ValueError, match="cannot be enforced"):
        _grammar(schema)


@pytest.mark.parametrize("schema", [
    {"$defs": {"i": {"type": "integer"}}, "$ref": "#/$defs/i", "description": "an id"},
    {"$defs": {"i": {"type": "integer"}}, "$ref": "#/$defs/i", "type": "integer"},
    {"type": "string", "enum": ["a", "b"], "title": "t", "default": "a"},
    {"const": "x"},
    {"type": "object", "properties": {"a": {"$ref": "#"}}},
    {"type": "object", "$ref": "#/$defs/A", "$defs": {"A": {
        "properties": {"a": {"type": "integer"}}, "required": ["a"]}}},
    {"format": "int64"},  # OpenAPI's: no string format, no type implied
    {"type": "integer", "format": "int32", "minimum": 0},
    {"type": "integer", "enum": [1, 2, 3], "minimum": 2},
])
def test_references_and_values_that_stand_alone_are_taken(schema: dict) -> None:
    assert unenforced_keyword(schema) is None, schema
    _grammar(schema)


def test_generated_outputs_validate_under_the_schema_as_written() -> None:
    """End to end on the tiny model: a Windows-path pattern (a backslash JSON must escape),
    a quote, untyped bounds and a typed enum; every sampled output parses and validates."""
    schema = {"type": "object", "properties": {
        "path": {"type": "string", "pattern": r"^[A-Z]:\\[a-z]{1,5}$"},
        "quote": {"type": "string", "pattern": r'^"[a-z]{1,3}"$'},
        "n": {"minimum": 1, "maximum": 5},
        "kind": {"type": "integer", "enum": [1.5, 2, 3]}},
        "required": ["path", "quote", "n", "kind"], "additionalProperties": False}
    llm = LLM(**vars(tiny_args(device="cpu")))
    try:
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=120,
                                 structured_outputs=StructuredOutputsParams(json=schema))
                  for i in range(8)]
        outs = llm.generate(["Give me the data:"] * 8, params, use_tqdm=False)
    finally:
        llm.shutdown()
    for out in outs:
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), schema)
