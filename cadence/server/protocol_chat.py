"""OpenAI-compatible chat completion request schemas: messages, tools, tool choice."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator

from cadence import chat, chat_options
from cadence.sampling_params import SamplingParams, StructuredOutputsParams
from cadence.server.protocol import NO_DEFAULTS, OpenAIModel, ParamError, SamplingRequest
from cadence.worker.grammar import check_structured_outputs

NO_MESSAGES = "messages must contain at least one message."


def check_template_options(
    chat_template_kwargs: dict[str, Any] | None, add_generation_prompt: bool,
    continue_final_message: bool,
) -> None:
    """The chat-template options of a conversation (chat completions, /tokenize)."""
    problem = chat_options.check_template_options(chat_template_kwargs, add_generation_prompt,
                                          continue_final_message)
    if problem is not None:
        raise ParamError(*problem)


class TextContentPart(OpenAIModel):
    # vLLM reads the Responses API's input_text / output_text parts as text too, and skips a
    # part whose text is null or missing.
    type: Literal["text", "input_text", "output_text"]
    text: str | None = None


class RefusalContentPart(OpenAIModel):
    """An assistant's refusal, as OpenAI clients replay it; text to the template (vLLM)."""

    type: Literal["refusal"]
    refusal: str | None = None


TEXT_PART_TYPES = tuple(chat.TEXT_PARTS)


def _part_kind(part: Any) -> str | None:
    if isinstance(part, str):
        return "string-part"
    if isinstance(part, dict):
        return "refusal-part" if part.get("type") == "refusal" else "text-part"
    if isinstance(part, (TextContentPart, RefusalContentPart)):
        return "refusal-part" if part.type == "refusal" else "text-part"
    return None


# NOTE: the tags are not identifiers, so an error's parameter path leaves them out and names
# the part's own field (messages.0.content.1.text), not the union member it was tried as.
# A plain string in a content list is a text part (vLLM reads it so).
ContentPart = Annotated[
    Annotated[TextContentPart, Tag("text-part")]
    | Annotated[RefusalContentPart, Tag("refusal-part")]
    | Annotated[str, Tag("string-part")],
    Discriminator(_part_kind, custom_error_type="content_part",
                  custom_error_message='a content part is a string or an object with a "type"'),
]


class FunctionCall(OpenAIModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(OpenAIModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenAIModel):
    # OpenAI's roles (chat.ROLES) or any other: it reaches the template, which decides (vLLM).
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    # An assistant's earlier reasoning, for templates that show it (interleaved thinking);
    # ``reasoning_content`` is its older name (vLLM takes both).
    reasoning: str | None = None
    reasoning_content: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        # Said plainly, instead of the union's "Input should be a valid string".
        if isinstance(value, list):
            for part in value:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind is not None and kind not in TEXT_PART_TYPES:
                    raise ValueError(f"only text content parts are supported, got {kind!r}")
        return value

    def parts(self) -> list[str | dict[str, Any]]:
        """The content list's parts as plain values (``chat.part_texts`` reads them)."""
        assert isinstance(self.content, list)
        return [part if isinstance(part, str) else part.model_dump() for part in self.content]

    def text(self) -> str:
        """The content as one text; text parts are joined by newlines, null ones skipped
        (vLLM)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(chat.part_texts(self.parts()))


class FunctionDefinition(OpenAIModel):
    # Other fields (OpenAI's strict, a template's own) reach the chat template, as vLLM's and
    # transformers' rendering keeps them.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatTool(OpenAIModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"] = "function"
    function: NamedFunction


_DEFINITION_KEYS = ("$defs", "definitions")  # JSON Schema's, and draft 7's older name


def _hoisted_definitions(tools: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tools' parameter schemas without their definitions, and those definitions merged
    (under the same keys) for the root of the schema that nests the parameters: their
    ``#/$defs/...`` references are to the root (vLLM hoists ``$defs`` so). A name two tools
    define differently is a ValueError. The request's own schemas are not changed."""
    params: dict[str, Any] = {}
    merged: dict[str, dict[str, Any]] = {}
    for name, schema in tools.items():
        if not isinstance(schema, dict) or not any(k in schema for k in _DEFINITION_KEYS):
            params[name] = schema
            continue
        params[name] = {k: v for k, v in schema.items() if k not in _DEFINITION_KEYS}
        for key in _DEFINITION_KEYS:
            defs = schema.get(key)
            if defs is None:
                continue
            if not isinstance(defs, dict):
                raise ValueError(f"function {name!r}: its parameters' {key} is not an object")
            into = merged.setdefault(key, {})
            for def_name, definition in defs.items():
                if def_name in into and into[def_name] != definition:
                    raise ValueError(f"the definition {def_name!r} ({key}) differs between "
                                     "tools; each name may have one schema")
                into[def_name] = definition
    return params, merged


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage]
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    # -1: the whole vocabulary (vLLM); at most --max-logprobs (the engine checks).
    top_logprobs: int | None = Field(default=None, ge=-1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: false asks for no reasoning part (under --reasoning-parser the answer is then all
    # content, its grammar applying from the first token).
    include_reasoning: bool = True
    # OpenAI's effort for reasoning models (vLLM's values); the chat template reads it as the
    # variable ``reasoning_effort`` (``template_kwargs``), as vLLM hands it over.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None \
        = None
    # vLLM: this request's own Jinja template (only with --trust-request-chat-template).
    chat_template: str | None = None
    # False: at most one tool call per answer (the first), as vLLM.
    parallel_tool_calls: bool | None = None
    # vLLM: the answer starts with the last message's content when that has the answer's role
    # (``answer_role``; a continued final message is returned whole).
    echo: bool = False
    return_token_ids: bool = False  # vLLM: ids of the prompt and of each chunk
    tools: list[ChatTool] | None = None
    # vLLM: documents for retrieval-augmented templates (their ``documents`` variable).
    documents: list[dict[str, str]] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None

    def check(self) -> None:
        """Semantic checks beyond the schema; raise ``ParamError`` naming the parameter."""
        self._check_common()
        if not self.messages:
            raise ParamError("messages", NO_MESSAGES)
        if self.tools is not None and not self.tools:  # OpenAI's rule, and vLLM's
            raise ParamError("tools", "tools must not be an empty array: give at least one tool "
                             "or leave the field out.")
        if self.top_logprobs and not self.logprobs:
            raise ParamError("top_logprobs", "when using top_logprobs, logprobs must be true.")
        if self.logprob_token_ids and not self.logprobs:
            raise ParamError("logprob_token_ids",
                             "when using logprob_token_ids, logprobs must be true.")
        if self.tool_choice is not None and not self.tools and self.tool_choice != "none":
            raise ParamError("tool_choice", "When using `tool_choice`, `tools` must be set.")
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function.name
            if name not in {t.function.name for t in self.tools or []}:
                raise ParamError("tool_choice", f"Tool {name!r} has not been passed in `tools`.")
        if isinstance(self.tool_choice, NamedToolChoice) and self.structured_outputs is not None:
            # vLLM's check_structured_outputs_count; with any other pairing of a forced tool
            # choice and a response_format or structured_outputs, the tools' grammar wins.
            raise ParamError("tool_choice", "a named function's tool_choice cannot be combined "
                             "with structured_outputs.")
        if self.use_beam_search and self.forced_tools:
            raise ParamError("tool_choice", "a forced tool choice (its grammar) is not "
                             "supported with use_beam_search.")
        check_template_options(self.chat_template_kwargs, self.add_generation_prompt,
                               self.continue_final_message)

    def template_kwargs(self) -> dict[str, Any] | None:
        """The template's extra variables, as vLLM merges them: ``chat_template_kwargs``, with
        the request's ``reasoning_effort`` over theirs, and ``enable_thinking`` (false for
        effort "none") where they set none."""
        if self.reasoning_effort is None:
            return self.chat_template_kwargs
        kwargs = {**(self.chat_template_kwargs or {}), "reasoning_effort": self.reasoning_effort}
        kwargs.setdefault("enable_thinking", self.reasoning_effort != "none")
        return kwargs

    def answer_role(self, response_role: str) -> str:
        """The answer's role (vLLM): ``response_role`` after the generation prompt, else the
        last message's (the answer goes on in its voice)."""
        return response_role if self.add_generation_prompt else self.messages[-1].role

    def echoed(self, role: str) -> str:
        """What ``echo`` puts before each choice's content: the last message's text when it
        has the answer's ``role`` (vLLM), else ""."""
        if self.echo and self.messages and self.messages[-1].role == role:
            return self.messages[-1].text()
        return ""

    @property
    def forced_tools(self) -> bool:
        """tool_choice "required" or a named function: the answer is the calls' JSON."""
        return bool(self.tools) and (self.tool_choice == "required"
                                     or isinstance(self.tool_choice, NamedToolChoice))

    @property
    def grammar_param(self) -> str:
        # A forced tool choice's grammar is built from the tools' parameter schemas.
        return "tools" if self.forced_tools else super().grammar_param

    def _structured_outputs(self) -> StructuredOutputsParams | None:
        """A forced tool choice constrains the answer to the calls' JSON (vLLM): the named
        function's arguments, or a list of {name, parameters} of the given tools."""
        if not self.forced_tools:
            return super()._structured_outputs()
        tools = {t.function.name: t.function.parameters or {"type": "object"}
                 for t in self.tools or []}
        named = self.tool_choice.function.name if isinstance(self.tool_choice,
                                                             NamedToolChoice) else None
        for i, tool in enumerate(self.tools or []):
            # Each tool in play alone first: an error names the tool whose schema it is.
            if named is None or tool.function.name == named:
                try:
                    spec = StructuredOutputsParams(json=tools[tool.function.name])
                    check_structured_outputs(spec)
                except ValueError as exc:
                    where = f"tools.{i}.function.parameters"
                    reason = str(exc).removeprefix("structured_outputs: ").removeprefix(
                        "invalid json: ")
                    raise ParamError(where, f"{where}: not a JSON schema this server can "
                                     f"follow: {reason}") from None
        if named is not None:
            return StructuredOutputsParams(json=tools[named])  # checked above
        try:
            tools, defs = _hoisted_definitions(tools)
            schema = {"type": "array", "minItems": 1, "items": {
                "anyOf": [{"type": "object",
                           "properties": {"name": {"type": "string", "enum": [name]},
                                          "parameters": params},
                           "required": ["name", "parameters"]}
                          for name, params in tools.items()]}}
            spec = StructuredOutputsParams(json={**schema, **defs})
            check_structured_outputs(spec)
        except ValueError as exc:
            raise ParamError("tools", f"tools: a function's parameters are not a schema this "
                             f"server can follow: {exc}") from None
        return spec

    @property
    def requested_max_tokens(self) -> int | None:
        # max_completion_tokens supersedes the deprecated max_tokens, as in OpenAI's API.
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def shown_logprobs(self) -> int | None:
        """Entries each token's top_logprobs shows: the top_logprobs most likely, or (None)
        every entry in its order: the sampled token, then the logprob_token_ids."""
        return None if self.logprob_token_ids else (self.top_logprobs or 0)

    def to_sampling_params(self, defaults: Mapping[str, Any] = NO_DEFAULTS) -> SamplingParams:
        """``defaults``: the model's default sampling fields (generation config)."""
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self._sampling_params(self.requested_max_tokens, logprobs, defaults,
                                     self.prompt_logprobs)
