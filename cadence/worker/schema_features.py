"""JSON-schema keywords the grammar engine (xgrammar) accepts but cannot enforce.

xgrammar compiles such a schema without complaint and the output then breaks the keyword (an
array with repeated items under ``uniqueItems``, a string longer than ``maxLength`` where a
``pattern`` is also given). vLLM refuses these schemas on its xgrammar backend; so do we, with a
400 that names the keyword, rather than return JSON that does not validate.
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
_MAX_DEPTH = 256  # deeper schemas are refused elsewhere; this walk never recurses further


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    return set()


def _string_with_bounds(schema: dict[str, Any]) -> bool:
    # A pattern or format is compiled and the length bounds beside it are dropped.
    return ("pattern" in schema or "format" in schema) and (
        "minLength" in schema or "maxLength" in schema)


def _own(schema: dict[str, Any]) -> str | None:
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


def unenforced_keyword(schema: Any) -> str | None:
    """The first keyword of ``schema`` (a parsed JSON schema) that the grammar would accept
    without enforcing it, or None."""
    stack: list[tuple[Any, int]] = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            found = _own(node)
            if found is not None:
                return found
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth < _MAX_DEPTH:
            stack.extend((child, depth + 1) for child in children
                         if isinstance(child, (dict, list)))
    return None
