"""The objects of a Responses API answer (``/v1/responses``): the ``Response`` with the
request's settings echoed, its usage, and the output items (reasoning, message, function call)
and their parts, as OpenAI shapes them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cadence.server.protocol import NO_DEFAULTS

if TYPE_CHECKING:
    from cadence.server.responses_api import ResponsesRequest

__all__ = ["call_item", "created_now", "message_item", "new_item_id", "reasoning_item",
           "reasoning_part", "response_object", "text_part", "usage_object"]


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_object(request: ResponsesRequest, response_id: str, model: str, created_at: int,
                    output: list[dict[str, Any]], usage: dict[str, Any] | None,
                    status: str = "completed",
                    defaults: Mapping[str, Any] = NO_DEFAULTS) -> dict[str, Any]:
    """The ``Response`` object: the request's settings echoed (``temperature`` and ``top_p``
    as applied: the model's ``defaults`` where the request left them out), ``output`` and
    ``usage``."""
    chat = request.chat
    temperature = chat.temperature if chat.temperature is not None else defaults.get(
        "temperature", 1.0)
    top_p = chat.top_p if chat.top_p is not None else defaults.get("top_p", 1.0)
    return {
        "id": response_id, "object": "response", "created_at": created_at, "status": status,
        "background": False, "error": None,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete"
                               else None),
        "instructions": request.instructions, "max_output_tokens": request.max_output_tokens,
        "metadata": request.metadata or {}, "model": model, "output": output,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": None, "reasoning": request.reasoning,
        "service_tier": request.service_tier or "auto", "store": False,
        "temperature": temperature, "text": request.text or {"format": {"type": "text"}},
        "tool_choice": request.tool_choice, "tools": request.tools,
        "top_logprobs": request.top_logprobs, "top_p": top_p,
        "truncation": request.truncation or "disabled", "usage": usage, "user": request.user,
    }


def usage_object(prompt: int, completion: int, cached: int | None,
                 reasoning: int = 0) -> dict[str, Any]:
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached or 0, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + completion}


def reasoning_item(item_id: str, text: str | None) -> dict[str, Any]:
    """A reasoning item: in progress (``text`` None: opened, nothing yet) or done."""
    content = [] if text is None else [reasoning_part(text)]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content,
            "status": "in_progress" if text is None else "completed"}


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def message_item(item_id: str, text: str | None, status: str,
                 logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    content = [] if text is None else [text_part(text, logprobs)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content}


def call_item(item_id: str, call_id: str, name: str, arguments: str,
              status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def created_now() -> int:
    return int(time.time())
