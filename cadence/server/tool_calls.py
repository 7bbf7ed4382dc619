"""Tool calls in a model's text: vLLM's ``--tool-call-parser hermes``, ``llama3_json``
(``JsonCallStream``: Llama 3.x's JSON objects, see there), ``pythonic``
(``tool_calls_pythonic``) and ``mistral`` (``tool_calls_mistral``). Hermes: the
``<tool_call>`` JSON lines of the Hermes / Qwen2.5 / Qwen3 chat templates,

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

from cadence.json_nesting import MAX_JSON_DEPTH, nesting_depth
from cadence.server.held_text import tag_prefix_len
from cadence.server.tool_call_json import (
    CallStream,
    NotJson,
    ParsedCall,
    call_of,
    dumps_json,
    hermes_call,
    is_name,
    loads_json,
    new_call,
    no_constant,
)
from cadence.server.tool_calls_mistral import MistralCallStream, mistral_call_id
from cadence.server.tool_calls_pythonic import PythonicCallStream

__all__ = ["KEEPS_SPECIAL_TOKENS", "TOOL_CALL_PARSERS", "CallStream", "ParsedCall",
           "ToolCallStream", "parse_forced_calls", "parse_tool_calls", "tool_call_stream",
           "tool_calls_finish"]

START, END = "<tool_call>", "</tool_call>"
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral", "pythonic")
# Parsers whose tags are special tokens: their requests keep special tokens in the text.
KEEPS_SPECIAL_TOKENS = frozenset({"mistral"})


def parse_forced_calls(text: str, named: str | None, parser: str | None = None
                       ) -> list[ParsedCall] | None:
    """The calls of an answer that structured outputs held to the calls' JSON: the arguments of
    function ``named`` (as vLLM, whatever the text: cut short by max_tokens, the arguments are
    that prefix), or a list of {name, parameters} (tool_choice "required"; None when the text
    is not that JSON). None for no text at all. ``parser``: the server's tool-call parser;
    under ``mistral`` the calls get Mistral's ids (its templates refuse others in the history,
    as vLLM gives them with a Mistral tokenizer)."""
    if not text:
        return None
    calls: list[ParsedCall]
    if named is not None:
        calls = [new_call(named, text)]
    else:
        try:
            value = loads_json(text)
            if not isinstance(value, list) or not all(
                    isinstance(i, dict) and is_name(i.get("name")) for i in value):
                return None
            calls = [new_call(i["name"], dumps_json(i.get("parameters", {}))) for i in value]
        except NotJson:
            return None
    if parser == "mistral":
        calls = [ParsedCall(mistral_call_id(), c.name, c.arguments) for c in calls]
    return calls


def parse_tool_calls(text: str, parser: str = "hermes") -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of a whole output: what the parser's stream gives for it, so that a
    streamed answer and a whole one agree (see ``ToolCallStream``, ``JsonCallStream``)."""
    content, calls = tool_call_stream(parser).feed(text, final=True)
    return content or None, calls


def tool_call_stream(parser: str) -> CallStream:
    """A splitter of one answer for ``--tool-call-parser parser``."""
    if parser == "llama3_json":
        return JsonCallStream()
    if parser == "pythonic":
        return PythonicCallStream()
    if parser == "mistral":
        return MistralCallStream()
    if parser != "hermes":
        raise ValueError(f"unknown tool call parser {parser!r}; use one of "
                         f"{', '.join(TOOL_CALL_PARSERS)}.")
    return ToolCallStream()


def tool_calls_finish(finish: str | None, stream: CallStream) -> str | None:
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
            call = hermes_call(body.strip())
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


BOT = "<|python_tag|>"
_DECODER = json.JSONDecoder(parse_constant=no_constant)


class JsonCallStream:
    """vLLM's ``--tool-call-parser llama3_json`` (Llama 3.x's JSON tool calls): an answer that
    starts (after blanks) with ``<|python_tag|>`` or ``{`` is calls, JSON objects
    ``{"name": ..., "parameters" (or "arguments"): {...}}`` one after another, ``;`` between
    them; any other answer is content. Each call goes out whole once its object has closed.
    Where the JSON breaks off or is not a call before any call, the whole answer is content (as
    vLLM keeps an output whose calls do not parse); after calls, the rest is dropped (vLLM's
    answer with calls has no content; a call already sent cannot be taken back). As vLLM's
    streamed parser does, a call must start the answer (its whole-answer parser also finds one
    after text; here both agree)."""

    def __init__(self) -> None:
        self.text = ""  # the answer so far, while it may be (or is) calls
        # None: undecided; "content": all text is; "calls"; "after": past the calls, dropped.
        self.mode: str | None = None
        self.pos = 0  # in calls mode: where the next object may start
        self.calls: list[ParsedCall] = []
        self.cut_call = False  # the answer ended inside an object

    def feed(self, piece: str, final: bool = False) -> tuple[str, list[ParsedCall]]:
        """The content text and the finished calls that ``piece`` adds (``final``: nothing
        follows)."""
        if self.mode == "content":
            return piece, []
        if self.mode == "after":
            return "", []
        self.text += piece
        if self.mode is None:
            head = self.text.lstrip()
            if head.startswith(BOT) or head.startswith("{"):
                self.mode = "calls"
                self.pos = len(self.text) - len(head) + (len(BOT) if head.startswith(BOT) else 0)
            elif not final and BOT.startswith(head):  # blanks, or the start of the tag
                return "", []
            else:
                self.mode, text, self.text = "content", self.text, ""
                return text, []
        new: list[ParsedCall] = []
        text = self.text
        while True:
            while self.pos < len(text) and (text[self.pos].isspace() or text[self.pos] == ";"):
                self.pos += 1
            if self.pos == len(text):
                break
            try:
                obj, end = _DECODER.raw_decode(text, self.pos)
                call = call_of(obj, need_arguments=True)
            except (NotJson, ValueError, RecursionError):  # incomplete, not JSON, NaN
                obj = call = None
                end = -1
            if call is not None and nesting_depth(text[self.pos:end]) <= MAX_JSON_DEPTH:
                new.append(call)
                self.pos = end
                continue
            if end < 0 and not final:
                break  # wait for the object to close
            # Not a call: before any call the whole answer is content; after them the rest is
            # dropped. An object left open (cut by max_tokens) keeps a "length" finish.
            self.cut_call = text.startswith("{", self.pos) and end < 0
            after = bool(self.calls or new)
            self.mode, self.text = ("after" if after else "content"), ""
            self.calls.extend(new)
            return ("" if after else text), new
        self.calls.extend(new)
        if final:
            self.mode = "after"
        return "", new
