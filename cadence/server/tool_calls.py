"""Tool calls in a model's text (vLLM's ``--tool-call-parser hermes``): the ``<tool_call>`` JSON
lines of the Hermes / Qwen2.5 / Qwen3 chat templates,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

become OpenAI ``tool_calls`` (arguments as JSON text); the text before the first call is the
message's content (text between or after calls is not; a block that is not a valid call stays
content, see ``ToolCallStream``). Streamed, a call goes out whole once its
closing tag arrives; text that may be the start of a tag is held back until the next piece shows
what it is.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from cadence.chat import encodes_as_utf8
from cadence.json_nesting import MAX_JSON_DEPTH, nesting_depth
from cadence.server.held_text import tag_prefix_len

__all__ = ["TOOL_CALL_PARSERS", "ParsedCall", "ToolCallStream", "parse_forced_calls",
           "parse_tool_calls", "tool_calls_finish"]

START, END = "<tool_call>", "</tool_call>"
TOOL_CALL_PARSERS = ("hermes",)


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text


def new_call(name: str, arguments: str) -> ParsedCall:
    return ParsedCall(f"chatcmpl-tool-{uuid.uuid4().hex}", name, arguments)


class _NotJson(Exception):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJson(name)  # NaN / Infinity: not JSON


def _loads(text: str) -> Any:
    """``text`` as JSON, or ``_NotJson``: model output may nest past the parser's recursion
    limit, hold an integer past Python's digit limit, NaN or Infinity."""
    if nesting_depth(text) > MAX_JSON_DEPTH:
        raise _NotJson("too deep")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise _NotJson(str(exc)) from None


def _dumps(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)  # 1e999 parses as inf
    except ValueError as exc:
        raise _NotJson(str(exc)) from None
    if not encodes_as_utf8(text):  # a "\ud83d" escape parsed to a lone surrogate
        raise _NotJson("a lone surrogate")
    return text


def _call(body: str) -> ParsedCall | None:
    try:
        obj = _loads(body)
        if not isinstance(obj, dict) or not _is_name(obj.get("name")):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        # Arguments given as the text of a JSON object stay that text; any other value is
        # serialized (a bare string too, as vLLM's parser does), so arguments are always JSON.
        text = args if isinstance(args, str) and _is_json_object(args) else _dumps(args)
    except _NotJson:
        return None
    return new_call(obj["name"], text)


def _is_name(name: Any) -> bool:
    # A "\ud800" escape in the name parses to a lone surrogate, which no response can carry.
    return isinstance(name, str) and encodes_as_utf8(name)


def _is_json_object(text: str) -> bool:
    try:
        value = _loads(text)
        _dumps(value)
    except _NotJson:
        return False
    return isinstance(value, dict)


def parse_forced_calls(text: str, named: str | None) -> list[ParsedCall] | None:
    """The calls of an answer that structured outputs held to the calls' JSON: the arguments of
    function ``named`` (as vLLM, whatever the text: cut short by max_tokens, the arguments are
    that prefix), or a list of {name, parameters} (tool_choice "required"; None when the text
    is not that JSON). None for no text at all."""
    if not text:
        return None
    if named is not None:
        return [new_call(named, text)]
    try:
        value = _loads(text)
        if not isinstance(value, list) or not all(
                isinstance(i, dict) and _is_name(i.get("name")) for i in value):
            return None
        return [new_call(i["name"], _dumps(i.get("parameters", {}))) for i in value]
    except _NotJson:
        return None


def parse_tool_calls(text: str) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of a whole output: what ``ToolCallStream`` gives for it, so that a
    streamed answer and a whole one agree (see there)."""
    content, calls = ToolCallStream().feed(text, final=True)
    return content or None, calls


def tool_calls_finish(finish: str | None, stream: ToolCallStream) -> str | None:
    """The finish reason of an answer once ``stream`` has split it: "tool_calls" when it made
    calls, unless max_tokens cut it inside another block ("length": the client must see the
    truncation; vLLM's parser gives no calls at all then)."""
    if finish is None or not stream.calls or (finish == "length" and stream.cut_call):
        return finish
    return "tool_calls"


class ToolCallStream:
    """Splits streamed text into content and whole tool calls. Until the first valid call, all
    text is content (a block that is not a valid call included, as vLLM keeps an output whose
    calls do not parse); after it, valid blocks are calls, a block that is not one stays
    content as it stands (a call already sent cannot be taken back), and text outside blocks
    is dropped."""

    def __init__(self) -> None:
        self.pending = ""  # held back: the start of a tag, or a call whose end has not come
        self.in_call = False
        self.started = False  # a valid call went out: text outside calls is no longer content
        self.calls: list[ParsedCall] = []
        # The text ended inside a block that is not a call (an answer cut by max_tokens).
        self.cut_call = False

    def feed(self, piece: str, final: bool = False) -> tuple[str, list[ParsedCall]]:
        """The content text and the finished calls that ``piece`` adds (``final``: nothing
        follows; an unclosed call is parsed as it stands, held-back text goes out)."""
        text = self.pending + piece
        self.pending = ""
        content: list[str] = []
        new: list[ParsedCall] = []
        while text:
            if not self.in_call:
                head, tag, rest = text.partition(START)
                if tag:
                    if not self.started:
                        content.append(head)
                    self.in_call, text = True, rest
                    continue
                keep = 0 if final else tag_prefix_len(text, START)
                if not self.started:
                    content.append(text[: len(text) - keep])
                self.pending = text[len(text) - keep:]
                break
            body, tag, rest = text.partition(END)
            if not tag and not final:
                self.pending = text  # a call whose closing tag has not come yet
                break
            call = _call(body.strip())
            if call is None:  # not a call after all: it is text
                content.append(START + body + tag)
                self.cut_call = not tag
            else:
                new.append(call)
                self.started = True
            self.in_call, text = False, rest
        if final and self.in_call:  # the text ended right after an opening tag: no call
            content.append(START)
            self.in_call, self.cut_call = False, True
        self.calls.extend(new)
        return "".join(content), new
