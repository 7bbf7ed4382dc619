"""JSON-schema keywords the grammar engine (xgrammar) accepts but cannot enforce.

xgrammar compiles such a schema without complaint and the output then breaks the keyword (an
array with repeated items under ``uniqueItems``, a string longer than ``maxLength`` where a
``pattern`` is also given). vLLM refuses these schemas on its xgrammar backend; so do we, with a
400 that names the keyword, rather than return JSON that does not validate. Beyond vLLM's list:
``not``, ``if``/``then``/``else`` and the dependent keywords (draft 7's ``dependencies`` among
them) are ignored, and an ``allOf`` with more than one subschema or beside constraints turns the
whole node into "any JSON" (even its ``type`` is lost); an empty ``anyOf``/``oneOf`` allows only
an empty text and a negative length bound allows nothing (neither is a valid schema); an
``anyOf`` / ``oneOf`` compiles to its branches alone, losing the constraints beside it. A
``required`` name that ``properties`` does not declare is never enforced (and, where the object's
other properties are closed, never even allowed). A ``oneOf`` compiles as an ``anyOf``: one whose
branches this module cannot prove disjoint (by type, by const / enum values, by integer range,
or by a property both require with disjoint values: a tagged union) is refused, as an output
could match several. A ``$ref`` must be local (``#/...``) and stand alone (its target is all
the grammar reads); an ``enum`` / ``const`` may stand beside ``type``, bounds and ``pattern``
only (its values are all the grammar reads: an enum keeps those that meet them), and needs a
value that does; ``type: []`` allows nothing.
``schema_rewrite.enforceable_schema`` rewrites what can be (formats, patterns, untyped bounds).
"""

from __future__ import annotations

import json
from itertools import combinations
from typing import Any

from cadence.worker.schema_values import (
    VALUE_CHECKED,
    json_type,
    types_meet,
    value_meets,
)

__all__ = ["MAX_DEPTH", "STRING_FORMATS", "implied_types", "subschemas", "unenforced_keyword"]

# String formats xgrammar writes a grammar for; others would pass any string.
STRING_FORMATS = frozenset({
    "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
    "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
})
_ARRAY_KEYWORDS = ("uniqueItems", "contains", "minContains", "maxContains")
_IGNORED = ("not", "if", "then", "else", "dependentSchemas", "dependentRequired",
            "dependencies")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
# Keywords that say nothing about the value: an allOf of one subschema may stand beside them.
_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
    "writeOnly", "$defs", "definitions", "$schema", "$id", "allOf", "discriminator",
})
# Where a schema holds subschemas: one, a list of them, or a map of names to them.
_ONE = ("additionalProperties", "items", "contains", "propertyNames", "not", "if", "then", "else",
        "additionalItems", "unevaluatedItems", "unevaluatedProperties")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
MAX_DEPTH = 256  # deeper schemas are refused elsewhere; this walk never recurses further


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    return set()


# Keywords that constrain values of one JSON type; a node without ``type`` that has some gets
# those types in the grammar (xgrammar drops untyped number and string keywords).
_FAMILY_KEYWORDS = {
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "string": ("minLength", "maxLength", "pattern", "format"),
    "array": ("items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
              "contains", "minContains", "maxContains"),
    "object": ("properties", "patternProperties", "additionalProperties", "required",
               "minProperties", "maxProperties", "propertyNames"),
}
# Keywords beside which a node is no longer typed by its keywords alone.
_OWN_GRAMMAR = ("type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf")
# What says something about a value (an enum or $ref beside these loses them).
_CONSTRAINTS = frozenset({k for keys in _FAMILY_KEYWORDS.values() for k in keys}) | {
    "type", "anyOf", "oneOf", "allOf", "not", "$ref", "enum", "const", "if", "then", "else",
    "dependentSchemas", "dependentRequired", "dependencies", "unevaluatedItems",
    "unevaluatedProperties"}


def implied_types(schema: dict[str, Any]) -> set[str]:
    """The JSON types the keywords of an untyped node constrain (empty where it has a ``type``,
    values, a reference or branches of its own). A ``format`` counts only as a string format
    xgrammar knows (OpenAPI's ``int64`` and the like say nothing here)."""
    if any(k in schema for k in _OWN_GRAMMAR):
        return set()
    return {family for family, keys in _FAMILY_KEYWORDS.items()
            if any(k in schema and (k != "format" or schema[k] in STRING_FORMATS) for k in keys)}


def _beside(schema: dict[str, Any], key: str) -> set[str]:
    return (set(schema) & _CONSTRAINTS) - {key}


def _reference_problem(schema: dict[str, Any], root: Any) -> str | None:
    for key in ("$dynamicRef", "$recursiveRef"):
        if key in schema:
            return f"{key} (only local $ref is followed)"
    ref = schema.get("$ref")
    if ref is None:
        return None
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return f"$ref {ref!r} (only local references, '#/...', are followed)"
    beside = _beside(schema, "$ref")
    target = _resolve({"$ref": ref}, root)
    kept = (_types(target) or implied_types(target)) if target is not None else set()
    if beside == {"type"} and kept and kept <= _types(schema):
        return None  # a type its target keeps to anyway
    if beside:
        return "$ref beside other constraints (the grammar keeps only the reference)"
    return None


def _values_problem(schema: dict[str, Any]) -> str | None:
    key = "const" if "const" in schema else "enum" if "enum" in schema else None
    if key is None:
        return None
    if _beside(schema, key) - VALUE_CHECKED - {key}:
        return (f"{key} beside constraints other than type, bounds and pattern (the grammar "
                "keeps only its values)")
    values = _values(schema)
    if values is not None and not any(value_meets(v, schema) for v in values):
        return f"{key} with no value that meets the type, bounds or pattern beside it"
    return None


def _branches_drop_siblings(schema: dict[str, Any], key: str) -> bool:
    """An anyOf / oneOf compiles to its branches alone: keywords beside it that say something
    about the value are lost (a ``type`` too, unless every branch keeps to it)."""
    branches = schema.get(key)
    if not isinstance(branches, list):
        return False
    beside = set(schema) - _ANNOTATIONS - {key}
    if beside == {"type"}:
        outer = _types(schema)
        return not all(isinstance(b, dict) and _types(b) and _types(b) <= outer for b in branches)
    return bool(beside)


def _string_with_bounds(schema: dict[str, Any]) -> bool:
    # A pattern or format is compiled and the length bounds beside it are dropped.
    return ("pattern" in schema or "format" in schema) and (
        "minLength" in schema or "maxLength" in schema)


def _own(schema: dict[str, Any], root: Any) -> str | None:
    for key in _IGNORED:
        if key in schema:
            return key
    if schema.get("type") == []:
        return "type [] (no value has no type)"
    found = _reference_problem(schema, root) or _values_problem(schema)
    if found is not None or "enum" in schema or "const" in schema:
        return found  # values the keywords beside them are checked against (schema_values)
    all_of = schema.get("allOf")
    if all_of is not None and (not isinstance(all_of, list) or len(all_of) != 1
                               or not set(schema) <= _ANNOTATIONS):
        return "allOf (of more than one subschema, or beside other constraints)"
    for key in ("anyOf", "oneOf"):
        if schema.get(key) == []:
            return f"an empty {key}"
        if _branches_drop_siblings(schema, key):
            return f"{key} beside other constraints (the grammar keeps only its branches)"
    if _one_of_may_overlap(schema, root):
        return ("oneOf whose branches may overlap (the grammar allows any of them, so an "
                "output could match several; make them disjoint, e.g. a required property "
                "with its own const in each, or use anyOf)")
    for key in _COUNTS:
        value = schema.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            return f"a negative {key}"
    required = schema.get("required")
    if isinstance(required, list):
        declared = schema.get("properties")
        declared = declared if isinstance(declared, dict) else {}
        for name in required:
            if isinstance(name, str) and name not in declared:
                return f"required property {name!r} not declared in properties"
    types = _types(schema) or implied_types(schema)
    if types & {"integer", "number"} and "multipleOf" in schema:
        return "multipleOf"
    if "array" in types:
        for key in _ARRAY_KEYWORDS:
            if key in schema:
                return key
    if "string" in types:
        fmt = schema.get("format")
        if fmt is not None and fmt not in STRING_FORMATS:
            return f"format {fmt!r}"
        if _string_with_bounds(schema):
            return "minLength/maxLength beside a pattern or format"
    if "object" in types:
        names = schema.get("propertyNames")
        if isinstance(names, dict) and _string_with_bounds(names):
            return "propertyNames with minLength/maxLength beside a pattern or format"
        if "propertyNames" in schema and (
            "properties" in schema or "patternProperties" in schema
            or isinstance(schema.get("additionalProperties"), dict)
        ):
            return "propertyNames beside properties, patternProperties or additionalProperties"
        patterns = schema.get("patternProperties")
        if isinstance(patterns, dict) and ("properties" in schema or len(patterns) > 1):
            return "patternProperties beside properties, or more than one pattern"
    return None


def subschemas(schema: dict[str, Any]) -> list[Any]:
    """The schemas ``schema`` holds (not its data: enum, const and default values, or the
    names of its properties, are never read as schemas)."""
    found: list[Any] = []
    for key in _ONE:
        child = schema.get(key)
        if isinstance(child, dict):
            found.append(child)
    for key in _LISTS:
        child = schema.get(key)
        if isinstance(child, list):
            found.extend(c for c in child if isinstance(c, dict))
    for key in _MAPS:
        child = schema.get(key)
        if isinstance(child, dict):
            found.extend(c for c in child.values() if isinstance(c, dict))
    return found


def unenforced_keyword(schema: Any) -> str | None:
    """The first keyword of ``schema`` (a parsed JSON schema) that the grammar would accept
    without enforcing it, or None."""
    stack: list[tuple[Any, int]] = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict):
            continue
        found = _own(node, schema)
        if found is not None:
            return found
        if depth < MAX_DEPTH:
            stack.extend((child, depth + 1) for child in subschemas(node))
    return None


# Disjointness of oneOf branches -------------------------------------------------------------
_MAX_REFS = 32


def _resolve(node: Any, root: Any) -> dict[str, Any] | None:
    """``node`` with its local ``$ref`` chain followed ("#/..."); None where that fails or
    the reference has constraints beside it."""
    for _ in range(_MAX_REFS):
        if not isinstance(node, dict):
            return None
        ref = node.get("$ref")
        if ref is None:
            return node
        if not isinstance(ref, str) or not ref.startswith("#") or set(node) - _ANNOTATIONS - {
                "$ref"}:
            return None
        node = root
        for part in ref[1:].split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, dict) else None
    return None


def _value_key(value: Any) -> str:
    # JSON equality: 1 and 1.0 are one number, true is not 1.
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"n:{float(value) + 0.0!r}"  # -0.0 is 0
    return json.dumps(value, sort_keys=True)


def _values(schema: dict[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return enum if isinstance(enum, list) else None


def _integer_range(schema: dict[str, Any]) -> tuple[float, float]:
    low, high = float("-inf"), float("inf")
    for key, bound in (("minimum", 0), ("exclusiveMinimum", 1)):
        v = schema.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            low = max(low, v + bound)
    for key, bound in (("maximum", 0), ("exclusiveMaximum", 1)):
        v = schema.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            high = min(high, v - bound)
    return low, high


def _disjoint(a: dict[str, Any] | None, b: dict[str, Any] | None, root: Any, depth: int) -> bool:
    """Whether no JSON value can match both ``a`` and ``b`` (False where unproven)."""
    if a is None or b is None or depth > _MAX_REFS:
        return False
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None:
        return not {_value_key(v) for v in va} & {_value_key(v) for v in vb}
    ta, tb = _types(a), _types(b)
    for values, types in ((va, tb), (vb, ta)):
        if values is not None and types and not any(
                types_meet({json_type(v)}, types) for v in values):
            return True
    if ta and tb and not types_meet(ta, tb):
        return True
    if ta == tb == {"integer"}:
        (lo_a, hi_a), (lo_b, hi_b) = _integer_range(a), _integer_range(b)
        if hi_a < lo_b or hi_b < lo_a:
            return True
    if ta == tb == {"object"}:
        pa, pb = a.get("properties"), b.get("properties")
        ra, rb = a.get("required"), b.get("required")
        if all(isinstance(x, dict) for x in (pa, pb)) and all(isinstance(x, list)
                                                              for x in (ra, rb)):
            for name in set(ra) & set(rb):
                if isinstance(name, str) and _disjoint(_resolve(pa.get(name), root),
                                                       _resolve(pb.get(name), root), root,
                                                       depth + 1):
                    return True
    return False


# Branches compared pair by pair at most (the pairs grow with the square: 4,000 branches, in a
# schema the size bound allows, took 11 s); branches of const / enum values alone are compared
# by one set, however many.
_MAX_PAIRWISE_BRANCHES = 128


def _one_of_may_overlap(schema: dict[str, Any], root: Any) -> bool:
    branches = schema.get("oneOf")
    if not isinstance(branches, list) or len(branches) < 2:
        return False
    resolved = [_resolve(b, root) for b in branches]
    values = [None if b is None else _values(b) for b in resolved]
    if all(v is not None for v in values):
        keys = [{_value_key(x) for x in v} for v in values]  # type: ignore[union-attr]
        return sum(map(len, keys)) != len(set().union(*keys))
    if len(resolved) > _MAX_PAIRWISE_BRANCHES:
        return True
    return any(not _disjoint(a, b, root, 0) for a, b in combinations(resolved, 2))
