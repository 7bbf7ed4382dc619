"""vLLM's ``--tool-call-parser mistral``: the text before the first ``[TOOL_CALLS]`` is content;
after it come the calls, in either of Mistral's forms,

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]
    [TOOL_CALLS]get_weather{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}

(the first of older tokenizers, the second of tokenizer v11 and later, ``[ARGS]`` optional).
Calls get Mistral's ids (nine letters and digits: its chat templates refuse others when the
conversation comes back). Text after the tag that is not such calls makes the whole answer
content, as vLLM keeps an output whose calls do not parse. ``[TOOL_CALLS]`` is a special token:
requests read by this parser keep special tokens in their text (``skip_special_tokens`` off,
as vLLM sets it). Streamed, content goes out until the tag; the calls go out whole at the end.
"""

from __future__ import annotations

import json
import secrets
import string

from cadence.json_nesting import MAX_JSON_DEPTH, nesting_depth
from cadence.server.held_text import tag_prefix_len
from cadence.server.tool_call_json import (
    NotJson,
    ParsedCall,
    call_of,
    dumps_json,
    is_json_object,
    is_name,
    loads_json,
)

__all__ = ["BOT", "MistralCallStream", "mistral_call_id", "parse_mistral_calls"]

BOT, ARGS = "[TOOL_CALLS]", "[ARGS]"
_ID_CHARS = string.ascii_letters + string.digits
_DECODER = json.JSONDecoder()


def mistral_call_id() -> str:
    return "".join(secrets.choice(_ID_CHARS) for _ in range(9))


def _with_mistral_id(call: ParsedCall) -> ParsedCall:
    return ParsedCall(mistral_call_id(), call.name, call.arguments)


def _named_call(segment: str) -> ParsedCall | None:
    """``name{json}`` or ``name[ARGS]{json}`` (one v11 call), else None."""
    head, sep, body = segment.partition(ARGS)
    if not sep:
        brace = segment.find("{")
        if brace < 0:
            return None
        head, body = segment[:brace], segment[brace:]
    name, body = head.strip(), body.strip()
    if not name or not is_name(name) or any(c.isspace() for c in name):
        return None
    if nesting_depth(body) > MAX_JSON_DEPTH:
        return None
    try:
        value, end = _DECODER.raw_decode(body)
    except (ValueError, RecursionError):
        return None
    if body[end:].strip() or not isinstance(value, dict):
        return None
    try:
        return ParsedCall(mistral_call_id(), name,
                          body[:end] if is_json_object(body[:end]) else dumps_json(value))
    except NotJson:
        return None


def parse_mistral_calls(after: str) -> list[ParsedCall] | None:
    """The calls of the text after the first ``[TOOL_CALLS]``, or None when it is not calls."""
    segments = [s.strip() for s in after.split(BOT)]
    if not segments[0] or segments[0][0] in "[{":  # the JSON form, once
        if len(segments) > 1 and any(segments[1:]):
            return None
        try:
            value = loads_json(segments[0])
        except NotJson:
            return None
        items = value if isinstance(value, list) else [value]
        calls = [call_of(item) for item in items]
        if not items or any(c is None for c in calls):
            return None
        return [_with_mistral_id(c) for c in calls if c is not None]
    named = [_named_call(s) for s in segments if s]
    if not named or any(c is None for c in named):
        return None
    return [c for c in named if c is not None]


class MistralCallStream:
    """The streamed form: ``feed`` as ``ToolCallStream.feed``."""

    def __init__(self) -> None:
        self.pending = ""  # the start of the tag, held back
        self.after: str | None = None  # the text since the tag, once it came
        self.held = ""  # content held with it (the tag), shown if the calls do not parse
        self.calls: list[ParsedCall] = []
        self.cut_call = False

    def feed(self, piece: str, final: bool = False) -> tuple[str, list[ParsedCall]]:
        if self.after is not None:
            self.after += piece
            return self._end() if final else ("", [])
        text = self.pending + piece
        head, tag, rest = text.partition(BOT)
        if not tag:
            keep = 0 if final else tag_prefix_len(text, BOT)
            self.pending = text[len(text) - keep:]
            return text[: len(text) - keep], []
        self.pending, self.after = "", rest
        if final:
            shown, calls = self._end()
            return head + shown, calls
        return head, []

    def _end(self) -> tuple[str, list[ParsedCall]]:
        assert self.after is not None
        calls = parse_mistral_calls(self.after)
        if calls is None:  # not calls: the tag and what follows are content
            return BOT + self.after, []
        self.calls.extend(calls)
        return "", calls
