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
other properties are closed, never even allowed).
"""

from __future__ import annotations

from typing import Any

__all__ = ["STRING_FORMATS", "unenforced_keyword"]

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
_MAX_DEPTH = 256  # deeper schemas are refused elsewhere; this walk never recurses further


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    return set()


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


def _own(schema: dict[str, Any]) -> str | None:
    for key in _IGNORED:
        if key in schema:
            return key
    all_of = schema.get("allOf")
    if all_of is not None and (not isinstance(all_of, list) or len(all_of) != 1
                               or not set(schema) <= _ANNOTATIONS):
        return "allOf (of more than one subschema, or beside other constraints)"
    for key in ("anyOf", "oneOf"):
        if schema.get(key) == []:
            return f"an empty {key}"
        if _branches_drop_siblings(schema, key):
            return f"{key} beside other constraints (the grammar keeps only its branches)"
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
    types = _types(schema)
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


def _subschemas(schema: dict[str, Any]) -> list[Any]:
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
        found = _own(node)
        if found is not None:
            return found
        if depth < _MAX_DEPTH:
            stack.extend((child, depth + 1) for child in _subschemas(node))
    return None
