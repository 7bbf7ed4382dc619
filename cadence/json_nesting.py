"""How deeply a JSON document nests, without recursion: request fields that carry JSON (schemas,
tool-call arguments) are bounded by it before anything recursive (a parser, a grammar compiler,
``copy.deepcopy``) walks them."""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_JSON_DEPTH", "nesting_depth"]

# Objects and arrays inside one another, the outermost counting 1. A JSON schema spends about
# two levels per nested object (the schema and its "properties").
MAX_JSON_DEPTH = 64


def nesting_depth(value: Any) -> int:
    """The deepest nesting of dicts / lists (or tuples) in ``value``; for a string, of ``{`` /
    ``[`` in it read as JSON text (brackets inside string literals do not count)."""
    if isinstance(value, str):
        return _text_depth(value)
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _text_depth(text: str) -> int:
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "}]":
            depth = max(0, depth - 1)
    return deepest
