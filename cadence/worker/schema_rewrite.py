"""A JSON schema rewritten into one the grammar engine (xgrammar) enforces: the same or fewer
outputs, each valid under the schema as the caller wrote it.

- ``date``, ``date-time``, ``ipv4`` and ``hostname`` formats, whose grammars let impossible
  values through (November 31st, leading zeros, 64-character labels), become exact patterns;
- patterns are written for JSON text (``schema_patterns``: escaped characters, counted optional
  groups);
- a node without ``type`` whose number or string keywords xgrammar would drop (it reads
  ``{"minimum": 1}`` as "any JSON") gets the types those keywords apply to: values of the other
  types would be valid too, so the outputs are a part of what the schema allows;
- an ``enum`` keeps only the values that meet the ``type``, bounds and pattern beside it
  (xgrammar reads the values alone).
``schema_features.unenforced_keyword`` refuses what cannot be rewritten so.
"""

from __future__ import annotations

import copy
from typing import Any

from cadence.worker.schema_features import MAX_DEPTH, implied_types, subschemas
from cadence.worker.schema_patterns import json_string_pattern, optional_groups_counted
from cadence.worker.schema_values import value_meets

__all__ = ["EXACT_FORMATS", "enforceable_schema"]

_DAY = ("(((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01]))|((0[469]|11)-(0[1-9]|[12][0-9]|30))"
        "|(02-(0[1-9]|1[0-9]|2[0-8])))")
_DATE = ("(([0-9]{4}-" + _DAY + ")|(([0-9]{2}(0[48]|[2468][048]|[13579][26])"
         "|(([02468][048]|[13579][26])00))-02-29))")
_TIME = ("([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)([.][0-9]+)?"
         "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])")
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LABEL = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"  # RFC 1123: 1-63, no hyphen at an end
EXACT_FORMATS = {
    "date": f"^{_DATE}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "ipv4": f"^{_OCTET}([.]{_OCTET}){{3}}$",
    "hostname": f"^{_LABEL}([.]{_LABEL})*$",
}


def _written(pattern: str) -> str:
    return optional_groups_counted(json_string_pattern(pattern))


def _rewrite(node: dict[str, Any]) -> bool:
    """Rewrite one node in place; whether anything changed."""
    changed = False
    enum = node.get("enum")
    if isinstance(enum, list):  # NOTE: first, against the pattern as the caller wrote it
        kept = [v for v in enum if value_meets(v, node)]
        changed |= len(kept) != len(enum)
        node["enum"] = kept
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in EXACT_FORMATS and "pattern" not in node:
        node["pattern"] = EXACT_FORMATS[node.pop("format")]
        changed = True
    if isinstance(node.get("pattern"), str):
        written = _written(node["pattern"])
        changed |= written != node["pattern"]
        node["pattern"] = written
    props = node.get("patternProperties")
    if isinstance(props, dict):
        written_props = {_written(k): v for k, v in props.items()}
        changed |= list(written_props) != list(props)
        node["patternProperties"] = written_props
    implied = implied_types(node)
    if implied & {"number", "string"}:
        node["type"] = implied.pop() if len(implied) == 1 else sorted(implied)
        changed = True
    return changed


def enforceable_schema(schema: Any) -> Any:
    """``schema`` rewritten as the module's docstring says; the schema itself where nothing
    changes (a copy otherwise)."""
    # NOTE: a deep copy per compiled schema (compiling costs far more); the caller's stays whole.
    rewritten = copy.deepcopy(schema)
    changed = False
    done: set[int] = set()  # NOTE: a subschema dict used in several places is rewritten once
    stack: list[tuple[Any, int]] = [(rewritten, 0)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict) or depth > MAX_DEPTH or id(node) in done:
            continue
        done.add(id(node))
        changed |= _rewrite(node)
        stack.extend((child, depth + 1) for child in subschemas(node))
    return rewritten if changed else schema
