"""POST /v1/responses (OpenAI's Responses API, as vLLM serves it without a response store): the
request's schema, its translation into a chat completion request (the chat endpoint's template,
parsers and engine path do the work); the objects of the answer are in
``responses_objects``.

Input: a string (one user message) or a list of items: messages (``role`` and text content or
``input_text`` / ``output_text`` parts), an earlier ``function_call`` and its
``function_call_output``, and ``reasoning`` items (vLLM's merge: a reasoning item, the calls
and text after it are one assistant message, its ``reasoning`` for templates that show the
thinking of the turn in progress); ``instructions`` come first as a system message. Nothing is
stored:
``previous_response_id`` and ``background`` are 400s, and the answer says ``"store": false``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError

from cadence.field_checks import INT64_MAX, INT64_MIN
from cadence.json_nesting import MAX_JSON_DEPTH, nesting_depth
from cadence.sampling_checks import MAX_TEMPERATURE
from cadence.server.errors import chosen_error
from cadence.server.protocol import (
    MAX_REQUEST_ID_CHARS,
    OpenAIModel,
    ParamError,
    StructuredOutputsField,
)
from cadence.server.protocol_chat import ChatCompletionRequest

__all__ = ["ResponsesRequest", "param_of"]

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# OpenAI's include values; only the logprobs one has something to show here (no hosted tools,
# images or encrypted reasoning), the others are accepted and add nothing.
INCLUDABLE = Literal["code_interpreter_call.outputs", "computer_call_output.output.image_url",
                     "file_search_call.results", "message.input_image.image_url",
                     "message.output_text.logprobs", "reasoning.encrypted_content",
                     "web_search_call.action.sources", "web_search_call.results"]
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
_TEXT_PARTS = ("input_text", "output_text", "text")
_ROLES = ("user", "assistant", "system", "developer")


class ResponsesRequest(OpenAIModel):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool | None = False  # null: false (OpenAI's schema, vLLM's)
    store: bool | None = True
    background: bool | None = False
    previous_response_id: str | None = None
    conversation: Any = None  # OpenAI's stored conversations: refused, as previous_response_id
    prompt: Any = None  # OpenAI's stored prompt templates: refused
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = True
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] = "auto"
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    include: list[Literal[INCLUDABLE]] | None = None
    top_logprobs: int | None = Field(default=0, ge=0, le=20)
    user: str | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = "auto"
    # vLLM's extensions.
    request_id: str | None = Field(default=None, min_length=1, max_length=MAX_REQUEST_ID_CHARS)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    cache_salt: str | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsField | None = None

    _chat: ChatCompletionRequest | None = PrivateAttr(default=None)
    # Per chat message: the input it came from, and each of its tool calls' input item.
    _origins: list[tuple[str, list[str]]] = PrivateAttr(default_factory=list)

    def check(self) -> None:
        """Refuse what this server does not do; build the chat request (``chat``)."""
        if self.previous_response_id is not None:
            raise ParamError("previous_response_id", "previous_response_id is not supported: "
                             "this server keeps no responses; send the conversation as input.")
        for name in ("conversation", "prompt"):
            if getattr(self, name) is not None:
                raise ParamError(name, f"{name} is not supported: this server keeps no stored "
                                 "conversations or prompts; send them as input.")
        if self.background:
            raise ParamError("background", "background responses are not supported.")
        if isinstance(self.input, list) and not self.input:
            raise ParamError("input", "input must not be an empty list.")
        if self.metadata is not None and (
                len(self.metadata) > MAX_METADATA_PAIRS
                or any(len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE
                       for k, v in self.metadata.items())):
            raise ParamError("metadata", f"metadata holds at most {MAX_METADATA_PAIRS} pairs, "
                             f"keys of at most {MAX_METADATA_KEY} characters and values of "
                             f"at most {MAX_METADATA_VALUE}.")
        for name in ("reasoning", "text", "tools", "tool_choice"):
            # NOTE: the response echoes these: bounded before its serializer walks them.
            if nesting_depth(getattr(self, name)) > MAX_JSON_DEPTH:
                raise ParamError(name, f"{name}: nests deeper than {MAX_JSON_DEPTH} levels.")
        body: dict[str, Any] = {
            # NOTE: a chat stream always: a whole response is its stream's last event.
            "model": self.model, "messages": self._messages(), "stream": True,
            "max_completion_tokens": self.max_output_tokens, "temperature": self.temperature,
            "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed, "stop": self.stop,
            "ignore_eos": self.ignore_eos, "repetition_penalty": self.repetition_penalty,
            "logit_bias": self.logit_bias, "priority": self.priority,
            "cache_salt": self.cache_salt, "user": self.user,
            "skip_special_tokens": self.skip_special_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "parallel_tool_calls": self.parallel_tool_calls,
            "truncate_prompt_tokens": -1 if self.truncation == "auto" else None,
        }
        if self._continues_final_message():
            body["continue_final_message"], body["add_generation_prompt"] = True, False
        if self.structured_outputs is not None:
            body["structured_outputs"] = self.structured_outputs.model_dump(by_alias=True,
                                                                            exclude_none=True)
        if self.tools:
            body["tools"] = [self._tool(i, t) for i, t in enumerate(self.tools)]
            body["tool_choice"] = self._tool_choice()
        elif self.tool_choice not in ("auto", "none"):
            raise ParamError("tool_choice", "When using `tool_choice`, `tools` must be set.")
        fmt = (self.text or {}).get("format")
        if fmt is not None:
            body["response_format"] = self._format(fmt)
        effort = (self.reasoning or {}).get("effort")
        if effort is not None:
            body["reasoning_effort"] = effort
        if self.logprobs_wanted:
            body["logprobs"], body["top_logprobs"] = True, self.top_logprobs or 0
        try:
            chat = ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:
            err, path = chosen_error(exc)
            where = self.renamed(".".join(path))
            raise ParamError(param_of(where), f"{where}: {err['msg']}") from None
        try:
            chat.check()
        except ParamError as exc:
            raise ParamError(self.param_named(exc.param or ""), self.renamed(str(exc))) from None
        self._chat = chat

    def param_named(self, chat_param: str) -> str:
        """A chat request's field (or message path) as this request names it: a message or
        call as the input item it came from, another field by its Responses name."""
        return param_of(self.renamed(chat_param))

    def renamed(self, text: str) -> str:
        """``text`` with each chat message path (``messages.N``, ``messages.N.tool_calls.J
        .function``) as the input item it came from (``instructions``, ``input``,
        ``input.K``), and the chat request's other names as this request's."""
        def item(match: re.Match[str]) -> str:
            n = int(match.group(1))
            if n >= len(self._origins):
                return match.group(0)
            origin, calls = self._origins[n]
            if match.group(2) is not None and int(match.group(2)) < len(calls):
                # a call's id is its item's call_id
                return calls[int(match.group(2))] + (".call_id" if match.group(3) else "")
            return origin

        def names(part: str) -> str:
            part = _MESSAGE_PATH.sub(item, part)
            for pattern, name in _CHAT_NAMES:
                part = pattern.sub(name, part)
            return part

        # NOTE: a quoted part is the client's own value (a tool's name, say): kept as sent.
        pieces = _QUOTED.split(text)
        return "".join(p if i % 2 else names(p) for i, p in enumerate(pieces))

    @property
    def chat(self) -> ChatCompletionRequest:
        assert self._chat is not None, "check() builds the chat request"
        return self._chat

    @property
    def logprobs_wanted(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or [])

    def _continues_final_message(self) -> bool:
        """An input ending in an assistant message still in progress or incomplete (a cut
        answer sent back) is continued, not answered (vLLM's should_continue_final_message)."""
        if isinstance(self.input, str) or not self.input:
            return False
        last = self.input[-1]
        return (last.get("type", "message") == "message" and last.get("role") == "assistant"
                and last.get("status") in ("in_progress", "incomplete"))

    def _messages(self) -> list[dict[str, Any]]:
        """The conversation as chat messages; ``_origins`` says where each came from (and each
        of an assistant message's calls), for errors that name them."""
        messages: list[dict[str, Any]] = []
        origins = self._origins = []
        if self.instructions:  # vLLM's: an empty one adds no system turn
            messages.append({"role": "system", "content": self.instructions})
            origins.append(("instructions", []))
        if isinstance(self.input, str):
            origins.append(("input", []))
            return [*messages, {"role": "user", "content": self.input}]
        for i, item in enumerate(self.input):
            kind = item.get("type", "message" if "role" in item else None)
            # The assistant turn the item may join (vLLM merges an item into one before it).
            turn = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
            if kind == "message":
                if item.get("content") is None:
                    raise ParamError(f"input.{i}.content", f"input.{i}: a message needs content.")
                if item.get("role") not in _ROLES:  # OpenAI's input message roles (vLLM's)
                    raise ParamError(f"input.{i}.role", f"input.{i}: role must be one of "
                                     f"{', '.join(_ROLES)}, got {item.get('role')!r}.")
                content = _text_of(item.get("content"), f"input.{i}")
                if (item.get("role") == "assistant" and turn is not None
                        and turn.get("content") is None):
                    turn["content"] = content  # the text of a turn its reasoning opened (vLLM)
                    continue
                messages.append({"role": item.get("role"), "content": content})
                origins.append((f"input.{i}", []))
            elif kind == "function_call":
                _need_string(item, ("call_id", "name", "arguments"), i)
                call = {"id": item.get("call_id"), "type": "function",
                        "function": {"name": item.get("name"), "arguments": item["arguments"]}}
                if turn is not None:
                    # Calls made together, and a turn's text before its calls (the order a
                    # response's own output comes back in), are one message (vLLM's).
                    turn.setdefault("tool_calls", []).append(call)
                    origins[-1][1].append(f"input.{i}")
                else:
                    messages.append({"role": "assistant", "content": None,
                                     "tool_calls": [call]})
                    origins.append((f"input.{i}", [f"input.{i}"]))
            elif kind == "function_call_output":
                _need_string(item, ("call_id",), i)
                if item.get("output") is None:
                    raise ParamError(f"input.{i}.output", f"input.{i}: a function_call_output "
                                     "needs output.")
                output = item.get("output")
                messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                                 "content": output if isinstance(output, str)
                                 else _text_of(output, f"input.{i}.output",
                                               parts=f"input.{i}.output")})
                origins.append((f"input.{i}", []))
            elif kind == "reasoning":
                reasoning = _reasoning_text(item, i)
                if turn is not None and turn.get("reasoning") is None:
                    turn["reasoning"] = reasoning
                else:
                    messages.append({"role": "assistant", "content": None,
                                     "reasoning": reasoning})
                    origins.append((f"input.{i}", []))
            else:
                raise ParamError(f"input.{i}", f"input.{i}: items of type {kind!r} are not "
                                 "supported (message, function_call, function_call_output, "
                                 "reasoning).")
        if all(m["role"] == "assistant" and m.get("content") is None
               and not m.get("tool_calls") for m in messages):
            raise ParamError("input", "input: no message, call or call output to answer "
                             "(reasoning items alone are not a conversation).")
        return messages

    @staticmethod
    def _tool(i: int, tool: dict[str, Any]) -> dict[str, Any]:
        if tool.get("type") != "function":
            raise ParamError(f"tools.{i}", f"tools.{i}: only function tools are supported, got "
                             f"{tool.get('type')!r}.")
        # Every field but the type (strict among them) is the function's, as vLLM reads it.
        return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}

    def _tool_choice(self) -> Any:
        choice = self.tool_choice
        if isinstance(choice, str):
            return choice
        if choice.get("type") == "function" and isinstance(choice.get("name"), str):
            return {"type": "function", "function": {"name": choice["name"]}}
        raise ParamError("tool_choice", "tool_choice: auto, none, required or "
                         "{\"type\": \"function\", \"name\": ...}.")

    @staticmethod
    def _format(fmt: Any) -> dict[str, Any]:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind in ("text", "json_object"):
            return {"type": kind}
        if kind == "json_schema":
            schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
            return {"type": "json_schema", "json_schema": schema}
        raise ParamError("text", "text.format: type text, json_object or json_schema.")


# A chat message's path in an error: messages.N, or one of its calls (tool_calls.J, .function).
_MESSAGE_PATH = re.compile(
    r"messages\.(\d+)(?:\.tool_calls\.(\d+)(?:\.function|(\.id)\b)?)?")


# The chat request's names for what a Responses request holds elsewhere.
_CHAT_NAMES = [(re.compile(r"\btools\.(\d+)\.function\."), r"tools.\1."),
               (re.compile(r"\breasoning_effort\b"), "reasoning.effort"),
               (re.compile(r"\bmax_completion_tokens\b"), "max_output_tokens"),
               (re.compile(r"\bresponse_format\b"), "text.format"),
               (re.compile(r"\bjson_schema\.(schema|name|strict|description)\b"), r"\1")]
_QUOTED = re.compile(r"""('[^']*'|"[^"]*")""")


def param_of(where: str) -> str:
    """A chat request's field as the Responses request names it (a path into ``input``, as
    ``renamed`` gives it, stays whole)."""
    if where.startswith(("input.", "instructions")):
        return where
    head = where.split(".", 1)[0]
    return {"messages": "input", "max_completion_tokens": "max_output_tokens",
            "response_format": "text", "reasoning_effort": "reasoning",
            "top_logprobs": "top_logprobs", "truncate_prompt_tokens": "truncation"
            }.get(head, head)


def _reasoning_text(item: dict[str, Any], i: int) -> str:
    """A reasoning item's text: its first content part's, else its first summary's (vLLM's
    order), else empty."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts is None or parts == []:
            continue
        first = parts[0] if isinstance(parts, list) else None
        text = first.get("text") if isinstance(first, dict) else None
        if not isinstance(text, str):
            raise ParamError(f"input.{i}.{key}", f"input.{i}: a reasoning item's {key} is a "
                             "list of parts with text.")
        return text
    return ""


def _need_string(item: dict[str, Any], names: tuple[str, ...], i: int) -> None:
    for name in names:
        if not isinstance(item.get(name), str):
            raise ParamError(f"input.{i}.{name}", f"input.{i}: a {item['type']} item needs "
                             f"{name} (a string).")


def _text_of(content: Any, where: str, parts: str | None = None) -> str | list[dict[str, Any]]:
    """A message's content (``where``: the message; its parts at ``where``.content.j) or an
    output (``parts``: the list itself, its parts at ``parts``.j) as chat content."""
    if isinstance(content, str):  # None is refused before (a missing content or output)
        return content
    if isinstance(content, list):
        at_parts = f"{where}.content" if parts is None else parts
        out = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            field = "refusal" if kind == "refusal" else "text" if kind in _TEXT_PARTS else None
            if field is None:
                raise ParamError(f"{at_parts}.{j}", f"{at_parts}.{j}: only text parts "
                                 f"(input_text, output_text, refusal) are supported.")
            if not isinstance(part.get(field), str):
                at = f"{at_parts}.{j}.{field}"
                raise ParamError(at, f"{at}: must be a string (a {kind!r} part's {field}).")
            out.append({"type": "text" if field == "text" else kind, field: part[field]})
        return out
    raise ParamError(where, f"{where}: content is a string or a list of text parts.")
