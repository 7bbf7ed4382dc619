"""What every tool-call parser shares: a parsed call (``ParsedCall``), JSON read and written
within the server's bounds (nesting, NaN, lone surrogates), and a call of a parsed
``{"name", "arguments" | "parameters"}`` object."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from cadence.chat import encodes_as_utf8
from cadence.json_nesting import MAX_JSON_DEPTH, nesting_depth

__all__ = ["CHAT_CALL_PREFIX", "CallStream", "NotJson", "ParsedCall", "call_of", "dumps_json", "hermes_call",
           "is_json_object", "is_name", "loads_json", "new_call", "no_constant"]


class CallStream(Protocol):
    """One answer's splitter into content and whole calls (one class per parser)."""

    calls: list[ParsedCall]
    cut_call: bool  # the answer ended inside what may have been a call

    def feed(self, piece: str, final: bool = False) -> tuple[str, list[ParsedCall]]: ...


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text


CHAT_CALL_PREFIX = "chatcmpl-tool-"  # vLLM's chat tool-call ids


def new_call(name: str, arguments: str) -> ParsedCall:
    return ParsedCall(f"{CHAT_CALL_PREFIX}{uuid.uuid4().hex}", name, arguments)


class NotJson(Exception):
    pass


def no_constant(name: str) -> Any:
    raise NotJson(name)  # NaN / Infinity: not JSON


def loads_json(text: str) -> Any:
    """``text`` as JSON, or ``NotJson``: model output may nest past the parser's recursion
    limit, hold an integer past Python's digit limit, NaN or Infinity."""
    if nesting_depth(text) > MAX_JSON_DEPTH:
        raise NotJson("too deep")
    try:
        return json.loads(text, parse_constant=no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise NotJson(str(exc)) from None


def dumps_json(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)  # 1e999 parses as inf
    except (ValueError, TypeError, RecursionError) as exc:  # a Python set, bytes, 1j: no JSON
        raise NotJson(str(exc)) from None
    if not encodes_as_utf8(text):  # a "\ud83d" escape parsed to a lone surrogate
        raise NotJson("a lone surrogate")
    return text


def hermes_call(body: str) -> ParsedCall | None:
    try:
        return call_of(loads_json(body))
    except NotJson:
        return None


def call_of(obj: Any, need_arguments: bool = False) -> ParsedCall | None:
    """A call of a parsed {"name", "arguments" (or "parameters")} object, else None;
    ``need_arguments``: an object without either is none (llama3_json's rule)."""
    try:
        if not isinstance(obj, dict) or not is_name(obj.get("name")):
            return None
        if need_arguments and "arguments" not in obj and "parameters" not in obj:
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        # Arguments given as the text of a JSON object stay that text; any other value is
        # serialized (a bare string too, as vLLM's parser does), so arguments are always JSON.
        text = args if isinstance(args, str) and is_json_object(args) else dumps_json(args)
    except NotJson:
        return None
    return new_call(obj["name"], text)


def is_name(name: Any) -> bool:
    # A "\ud800" escape in the name parses to a lone surrogate, which no response can carry.
    return isinstance(name, str) and encodes_as_utf8(name)


def is_json_object(text: str) -> bool:
    try:
        value = loads_json(text)
        dumps_json(value)
    except NotJson:
        return False
    return isinstance(value, dict)
