"""Large answers' JSON bodies are built choice by choice with the event loop given turns
between them, into the very bytes Starlette's JSONResponse renders for the whole."""

from __future__ import annotations

import asyncio

from starlette.responses import JSONResponse

from cadence.server.json_body import json_response
from cadence.server.protocol_chat import FunctionCall, ToolCall
from cadence.server.protocol_responses import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatLogProb,
    ChatLogProbs,
    ChatLogProbsContent,
    ChatResponseMessage,
    CompletionResponse,
    CompletionResponseChoice,
    UsageInfo,
)


def _chat(n: int) -> ChatCompletionResponse:
    choices = []
    for i in range(n):
        top = [ChatLogProb(token=f"t{j}\u00e9\"", logprob=-0.5 * j, bytes=[116, j])
               for j in range(3)]
        lps = ChatLogProbs(content=[ChatLogProbsContent(token="x\n", logprob=-1.25, bytes=[120],
                                                        top_logprobs=top)] * 4)
        calls = [ToolCall(id=f"c{i}", function=FunctionCall(name="f", arguments='{"a": 1}'))]
        choices.append(ChatCompletionResponseChoice(
            index=i, message=ChatResponseMessage(content=None if i % 2 else "h\u00e9\U0001F600",
                                                 tool_calls=calls if i % 3 == 0 else []),
            logprobs=lps if i % 2 == 0 else None, finish_reason="stop",
            stop_reason=None if i % 2 else 7, token_ids=[1, 2] if i == 1 else None))
    return ChatCompletionResponse(id="chatcmpl-x", model="m", choices=choices,
                                  usage=UsageInfo.of(5, 9, None, None))


def test_the_body_is_the_bytes_json_response_renders() -> None:
    completion = CompletionResponse(
        id="cmpl-y", model="m", usage=UsageInfo.of(1, 2, None),
        choices=[CompletionResponseChoice(index=i, text=f"a{i}\u2028", finish_reason="length")
                 for i in range(3)])
    for model in (_chat(1), _chat(2), _chat(7), completion,
                  ChatCompletionResponse(id="e", model="m", choices=[], usage=UsageInfo())):
        expected = JSONResponse(model.model_dump(mode="json"))
        got = asyncio.run(json_response(model))
        assert got.body == expected.body
        assert got.media_type == "application/json"


def test_the_loop_runs_other_tasks_between_choices() -> None:
    """A task waiting on the loop gets turns while the body is built (it used to wait for the
    whole dump and encoding)."""
    async def main() -> tuple[int, int]:
        turns = 0
        done = False

        async def other() -> None:
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        await asyncio.sleep(0)
        before = turns
        await json_response(_chat(50))
        done = True
        await task
        return before, turns

    before, after = asyncio.run(main())
    assert after - before >= 50


def test_a_list_that_is_the_models_last_field_is_rendered_last() -> None:
    from pydantic import BaseModel

    class Item(BaseModel):
        name: str
        score: float

    class Listing(BaseModel):
        id: str
        total: int
        items: list[Item]

    items = [Item(name=f"i{k}", score=k / 4) for k in range(3)]
    model = Listing(id="l\u00e9", total=3, items=items)
    got = asyncio.run(json_response(model, parts="items"))
    assert got.body == JSONResponse(model.model_dump(mode="json")).body
