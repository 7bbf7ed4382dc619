"""OpenAI-compatible response schemas (vLLM's field names and extensions)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from cadence.server.protocol import OpenAIModel
from cadence.server.protocol_chat import ToolCall


class PromptTokenUsageInfo(OpenAIModel):
    cached_tokens: int | None = None


class CompletionTokenUsageInfo(OpenAIModel):
    reasoning_tokens: int = 0


class UsageInfo(OpenAIModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    # With --enable-prompt-tokens-details and a prefix-cache hit (vLLM); absent otherwise.
    prompt_tokens_details: PromptTokenUsageInfo | None = None
    # Chat under a reasoning parser (vLLM); absent otherwise.
    completion_tokens_details: CompletionTokenUsageInfo | None = None

    @model_serializer(mode="wrap")
    def _details_when_shown(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for key in ("prompt_tokens_details", "completion_tokens_details"):
            if data.get(key) is None:
                data.pop(key, None)
        return data

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int | None = None,
           reasoning: int | None = None) -> UsageInfo:
        """``cached``: the prompt tokens the prefix cache supplied, shown when some were;
        ``reasoning``: the completion's reasoning tokens, shown where counted."""
        return cls(prompt_tokens=prompt, completion_tokens=completion,
                   total_tokens=prompt + completion,
                   prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=cached)
                   if cached else None,
                   completion_tokens_details=None if reasoning is None
                   else CompletionTokenUsageInfo(reasoning_tokens=reasoning))


class CompletionLogProbs(OpenAIModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(OpenAIModel):
    """One entry of vLLM's ``prompt_logprobs`` (a token id -> this, per prompt token)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionResponseChoice(OpenAIModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # The generated ids (of this chunk when streaming): with return_token_ids, or always when
    # the server has no tokenizer (its text is then empty).
    token_ids: list[int] | None = None
    # The prompt's ids, with return_token_ids (streamed: in each choice's first chunk).
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(OpenAIModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None


class CompletionStreamResponse(CompletionResponse):
    pass


class ChatLogProb(OpenAIModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogProbsContent(ChatLogProb):
    top_logprobs: list[ChatLogProb] = Field(default_factory=list)


class ChatLogProbs(OpenAIModel):
    content: list[ChatLogProbsContent] | None = None


class ChatResponseMessage(OpenAIModel):
    role: str = "assistant"
    content: str | None = None
    reasoning: str | None = None  # with --reasoning-parser (vLLM's field)
    tool_calls: list[ToolCall] = Field(default_factory=list)  # with --tool-call-parser

    @model_serializer(mode="wrap")
    def _no_empty_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # An answer without calls has no tool_calls key (OpenAI's and vLLM's message).
        data = handler(self)
        if not data.get("tool_calls"):
            data.pop("tool_calls", None)
        return data


class ChatCompletionResponseChoice(OpenAIModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # with return_token_ids (vLLM)


class ChatCompletionResponse(OpenAIModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    prompt_token_ids: list[int] | None = None  # with return_token_ids (vLLM)
    prompt_logprobs: PromptLogprobs | None = None


class DeltaMessage(OpenAIModel):
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None


class ChatCompletionStreamChoice(OpenAIModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # this chunk's ids, with return_token_ids


class ChatCompletionStreamResponse(OpenAIModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None  # in the first chunk, with return_token_ids


class ModelPermission(OpenAIModel):
    """vLLM's permission entry of a model card (fixed values: what a served model allows)."""

    id: str = Field(default_factory=lambda: f"modelperm-{uuid.uuid4().hex}")
    object: Literal["model_permission"] = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(OpenAIModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "cadence"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(OpenAIModel):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)
