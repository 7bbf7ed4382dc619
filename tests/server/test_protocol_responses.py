"""The response models' JSON: the keys OpenAI's and vLLM's responses carry or leave out, and the
fixed values of a model card."""

from __future__ import annotations

import json

from cadence.server.protocol_chat import ToolCall
from cadence.server.protocol_responses import (
    ChatResponseMessage,
    ModelCard,
    ModelList,
    UsageInfo,
)


def _json(model) -> dict:
    return json.loads(model.model_dump_json())


def test_reasoning_tokens_are_shown_where_counted_even_when_none() -> None:
    # Under a reasoning parser the count is shown, 0 included (vLLM's reasoning_tokens: 0);
    # without one (None) the key is absent.
    counted = _json(UsageInfo.of(3, 2, reasoning=0))
    assert counted["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert (counted["prompt_tokens"], counted["completion_tokens"], counted["total_tokens"]) == (
        3, 2, 5)
    assert "completion_tokens_details" not in _json(UsageInfo.of(3, 2))
    assert _json(UsageInfo.of(3, 2, reasoning=2))["completion_tokens_details"] == {
        "reasoning_tokens": 2}


def test_a_message_without_tool_calls_has_no_tool_calls_key() -> None:
    # OpenAI's chat message: tool_calls only where the model called a tool.
    plain = _json(ChatResponseMessage(role="assistant", content="hi"))
    assert plain["content"] == "hi" and "tool_calls" not in plain
    call = ToolCall.model_validate(
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}})
    called = _json(ChatResponseMessage(role="assistant", content=None, tool_calls=[call]))
    assert [c["function"]["name"] for c in called["tool_calls"]] == ["f"]


def test_a_model_card_carries_vllms_permission_entry() -> None:
    card = _json(ModelList(data=[ModelCard(id="m", root="m")]))["data"][0]
    assert card["object"] == "model" and card["owned_by"] == "cadence"  # vLLM writes "vllm"
    (perm,) = card["permission"]
    # vLLM's ModelPermission defaults: what any served model allows.
    expected = {"object": "model_permission", "allow_create_engine": False,
                "allow_sampling": True, "allow_logprobs": True, "allow_search_indices": False,
                "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                "group": None, "is_blocking": False}
    assert {k: perm[k] for k in expected} == expected
    assert perm["id"].startswith("modelperm-") and isinstance(perm["created"], int)
