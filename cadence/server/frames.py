"""SSE frames of streamed completions, built from per-request templates.

Every streamed token of every stream becomes one frame, so a frame must cost little: the parts
that never change within a request (id, created, model, index) are encoded once, and each chunk
only encodes its own values (``json.dumps`` of the text, small literals). The frames are the
same JSON documents as the pydantic chunk models (``CompletionStreamResponse``,
``ChatCompletionStreamResponse``) would dump, with the same keys in the same order; logprobs,
which are rare and larger, still go through their models.
"""

from __future__ import annotations

import json
import time
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _lit(value: Any) -> str:
    """A JSON literal for a small value (None, str, int), without the encoder's overhead."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return encode_basestring(value)  # the C escaper behind json.dumps(ensure_ascii=False)
    return _dumps(value)


def usage_json(prompt: int, completion: int, cached: int | None = None,
               reasoning: int | None = None) -> str:
    """``cached``: the prompt tokens from the prefix cache, shown when some were (vLLM's
    prompt_tokens_details); ``reasoning``: the completion's reasoning tokens, shown where
    counted (under a reasoning parser, vLLM's completion_tokens_details)."""
    details = f',"prompt_tokens_details":{{"cached_tokens":{cached}}}' if cached else ""
    if reasoning is not None:
        details += f',"completion_tokens_details":{{"reasoning_tokens":{reasoning}}}'
    return (
        f'{{"prompt_tokens":{prompt},"completion_tokens":{completion},'
        f'"total_tokens":{prompt + completion}{details}}}'
    )


def _model_json(model: BaseModel | None) -> str:
    return "null" if model is None else model.model_dump_json()


class _Frames:
    """The part of every frame of one response that never changes, and its usage frame."""

    object_name = ""

    def __init__(self, request_id: str, model: str, created: int | None = None) -> None:
        created = int(time.time()) if created is None else created
        self._head = (
            f'data: {{"id":{_lit(request_id)},"object":"{self.object_name}",'
            f'"created":{created},"model":{_lit(model)},"choices":'
        )

    def usage(self, prompt: int, completion: int, cached: int | None = None) -> str:
        return f'{self._head}[],"usage":{usage_json(prompt, completion, cached)}}}\n\n'


class CompletionFrames(_Frames):
    """``data: {...}`` frames of one streamed ``/v1/completions`` request."""

    object_name = "text_completion"

    def chunk(
        self,
        index: int,
        text: str,
        *,
        logprobs: BaseModel | None = None,
        finish_reason: str | None = None,
        stop_reason: int | str | None = None,
        token_ids: list[int] | None = None,
        usage: tuple[int, int] | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> str:
        ids = "null" if token_ids is None else _dumps(token_ids)
        use = "null" if usage is None else usage_json(*usage)
        prompt_ids = "null" if prompt_token_ids is None else _dumps(prompt_token_ids)
        return (
            f'{self._head}[{{"index":{index},"text":{encode_basestring(text)},'
            f'"logprobs":{_model_json(logprobs)},"finish_reason":{_lit(finish_reason)},'
            f'"stop_reason":{_lit(stop_reason)},"token_ids":{ids},'
            f'"prompt_token_ids":{prompt_ids},"prompt_logprobs":null}}],"usage":{use}}}\n\n'
        )


class ChatFrames(_Frames):
    """``data: {...}`` frames of one streamed ``/v1/chat/completions`` request."""

    object_name = "chat.completion.chunk"

    def chunk(
        self,
        *,
        content: str | None = None,
        role: str | None = None,
        logprobs: BaseModel | None = None,
        finish_reason: str | None = None,
        stop_reason: int | str | None = None,
        usage: tuple[int, int] | None = None,
        token_ids: list[int] | None = None,
        prompt_token_ids: list[int] | None = None,
        index: int = 0,
        reasoning: str | None = None,
        tool_calls: list[dict] | None = None,
        reasoning_tokens: int | None = None,
    ) -> str:
        """``usage``: (prompt, completion) tokens, continuous usage; ``reasoning_tokens``: its
        completion's reasoning tokens, where counted."""
        # A delta carries only what it sets (no "role": null on content chunks).
        delta = []
        if role is not None:
            delta.append(f'"role":{_lit(role)}')
        if content is not None:
            delta.append(f'"content":{encode_basestring(content)}')
        if reasoning is not None:
            delta.append(f'"reasoning":{encode_basestring(reasoning)}')
        if tool_calls:
            delta.append(f'"tool_calls":{_dumps(tool_calls)}')
        use = "null" if usage is None else usage_json(*usage, reasoning=reasoning_tokens)
        ids = "null" if token_ids is None else _dumps(token_ids)
        prompt_ids = "null" if prompt_token_ids is None else _dumps(prompt_token_ids)
        return (
            f'{self._head}[{{"index":{index},"delta":{{{",".join(delta)}}},'
            f'"logprobs":{_model_json(logprobs)},"finish_reason":{_lit(finish_reason)},'
            f'"stop_reason":{_lit(stop_reason)},"token_ids":{ids}}}],"usage":{use},'
            f'"prompt_token_ids":{prompt_ids}}}\n\n'
        )

    def usage(self, prompt: int, completion: int, cached: int | None = None,
              reasoning: int | None = None) -> str:
        return (f'{self._head}[],"usage":{usage_json(prompt, completion, cached, reasoning)},'
                f'"prompt_token_ids":null}}\n\n')
