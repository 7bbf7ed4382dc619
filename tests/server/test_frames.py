"""The templated SSE frames are the JSON documents the pydantic chunk models dump."""

from __future__ import annotations

import json

import pytest

from cadence.server.frames import ChatFrames, CompletionFrames
from cadence.server.protocol_responses import (
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatLogProb,
    ChatLogProbs,
    ChatLogProbsContent,
    CompletionLogProbs,
    CompletionResponseChoice,
    CompletionStreamResponse,
    DeltaMessage,
    UsageInfo,
)

TEXTS = ["", "plain", 'quote " backslash \\ newline \n tab \t', "\u2028\u2029 é 😀 \x00\x1f", "</s>"]


def _frame_json(frame: str) -> dict:
    assert frame.startswith("data: ") and frame.endswith("\n\n")
    return json.loads(frame[len("data: ") : -2])


def _model_json(model) -> dict:
    return json.loads(model.model_dump_json())


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("finish", [(None, None), ("stop", "###"), ("length", None), ("stop", 7)])
def test_completion_chunks_match_the_model(text: str, finish: tuple) -> None:
    frames = CompletionFrames("cmpl-1", 'model "x"', created=1700000000)
    lps = CompletionLogProbs(text_offset=[0], token_logprobs=[-0.5], tokens=["a"],
                             top_logprobs=[{"a": -0.5}])
    for logprobs, ids, usage, prompt in ((None, None, None, None),
                                         (lps, [1, 2], (3, 4), [7, 8, 9])):
        got = _frame_json(frames.chunk(2, text, logprobs=logprobs, finish_reason=finish[0],
                                       stop_reason=finish[1], token_ids=ids, usage=usage,
                                       prompt_token_ids=prompt))
        want = CompletionStreamResponse(
            id="cmpl-1", created=1700000000, model='model "x"',
            choices=[CompletionResponseChoice(index=2, text=text, logprobs=logprobs,
                                              finish_reason=finish[0], stop_reason=finish[1],
                                              token_ids=ids, prompt_token_ids=prompt)],
            usage=UsageInfo(prompt_tokens=3, completion_tokens=4, total_tokens=7)
            if usage else None,
        )  # fmt: skip
        assert got == _model_json(want)
        assert list(got) == list(_model_json(want))  # same key order
    usage_frame = _frame_json(frames.usage(10, 5))
    assert usage_frame == _model_json(CompletionStreamResponse(
        id="cmpl-1", created=1700000000, model='model "x"', choices=[],
        usage=UsageInfo(prompt_tokens=10, completion_tokens=5, total_tokens=15)))  # fmt: skip


@pytest.mark.parametrize("text", TEXTS)
def test_chat_chunks_match_the_model(text: str) -> None:
    frames = ChatFrames("chatcmpl-1", "m", created=5)
    lps = ChatLogProbs(content=[ChatLogProbsContent(token="a", logprob=-1.0, bytes=[97],
                                                    top_logprobs=[ChatLogProb(token="a",
                                                                              logprob=-1.0)])])
    cases = [
        (dict(role="assistant", content=""), DeltaMessage(role="assistant", content="")),
        (dict(content=text), DeltaMessage(content=text)),
        (dict(content=text, logprobs=lps, finish_reason="stop", stop_reason="x",
              usage=(2, 3)), DeltaMessage(content=text)),
        (dict(role="assistant", content="", prompt_token_ids=[5, 6, 7]),
         DeltaMessage(role="assistant", content="")),
        (dict(content=text, token_ids=[9, 10]), DeltaMessage(content=text)),
    ]  # fmt: skip
    for kwargs, delta in cases:
        got = _frame_json(frames.chunk(**kwargs))
        usage = kwargs.get("usage")
        want = ChatCompletionStreamResponse(
            id="chatcmpl-1", created=5, model="m",
            choices=[ChatCompletionStreamChoice(index=0, delta=delta,
                                                logprobs=kwargs.get("logprobs"),
                                                finish_reason=kwargs.get("finish_reason"),
                                                stop_reason=kwargs.get("stop_reason"),
                                                token_ids=kwargs.get("token_ids"))],
            usage=UsageInfo(prompt_tokens=usage[0], completion_tokens=usage[1],
                            total_tokens=sum(usage)) if usage else None,
            prompt_token_ids=kwargs.get("prompt_token_ids"),
        )  # fmt: skip
        data = _model_json(want)
        # A delta carries only what it sets.
        data["choices"][0]["delta"] = delta.model_dump(mode="json", exclude_none=True)
        assert got == data


def test_a_failed_request_ends_a_stream_of_several() -> None:
    """One request of a multi-prompt stream fails: the stream ends at once with the error (the
    handler then aborts the others), not when the healthy ones finish."""
    import asyncio

    from cadence.server.frame_stream import FrameStream

    async def main() -> None:
        stream = FrameStream(2)
        stream.sink(lambda out: "x").put(RuntimeError("boom"))  # the other never finishes
        assert stream.finished and isinstance(stream.error, RuntimeError)
        assert await stream.next() is None

    asyncio.run(main())


def test_usage_frames_carry_vllms_token_details() -> None:
    """vLLM's streamed usage: total = prompt + completion; prompt_tokens_details.cached_tokens
    where the prefix cache served some of the prompt; completion_tokens_details.reasoning_tokens
    under a reasoning parser (in the final usage and in a continuous usage chunk)."""
    completion = _frame_json(CompletionFrames("cmpl-1", "m", created=1).usage(10, 5, 4))
    assert completion["usage"] == {"prompt_tokens": 10, "completion_tokens": 5,
                                   "total_tokens": 15,
                                   "prompt_tokens_details": {"cached_tokens": 4}}
    chat = ChatFrames("chatcmpl-1", "m", created=1)
    final = _frame_json(chat.usage(10, 5, 4, reasoning=3))
    assert final["choices"] == [] and final["usage"] == {
        "prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 3}}
    continuous = _frame_json(chat.chunk(content="x", usage=(10, 5), reasoning_tokens=3))
    assert continuous["usage"] == {"prompt_tokens": 10, "completion_tokens": 5,
                                   "total_tokens": 15,
                                   "completion_tokens_details": {"reasoning_tokens": 3}}


def test_chat_chunks_of_a_later_choice_with_tool_calls() -> None:
    """A chunk of choice 2 (n > 1) is index 2; a tool call's delta rides in the delta as the
    OpenAI stream shows it."""
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\": 1}"}}
    got = _frame_json(ChatFrames("chatcmpl-1", "m", created=1).chunk(index=2, tool_calls=[call]))
    (choice,) = got["choices"]
    assert choice["index"] == 2
    assert choice["delta"] == {"tool_calls": [call]}


def _outputs_of(stream, *outputs):  # type: ignore[no-untyped-def]
    """Feed ``(request, text or None, finished)`` outputs to ``stream``'s sinks (one per
    request), as the output processor does; a None text renders as nothing to show."""
    from types import SimpleNamespace

    sinks: dict[int, object] = {}
    for request, text, finished in outputs:
        sink = sinks.setdefault(request, stream.sink(lambda out: out.text))
        sink.put(SimpleNamespace(text=text, finished=finished))


def test_frames_that_accumulated_go_out_together_in_order() -> None:
    """The response task fell behind: every frame since its last write goes out, in order, in
    one piece; an output that shows nothing (held-back text) adds none."""
    import asyncio

    from cadence.server.frame_stream import FrameStream

    async def main() -> None:
        stream = FrameStream()
        _outputs_of(stream, (0, "data: a\n\n", False), (0, None, False), (0, "data: b\n\n", False),
                    (0, "data: c\n\n", False))
        assert await stream.next() == "data: a\n\ndata: b\n\ndata: c\n\n"
        _outputs_of(stream, (0, None, True))
        assert stream.finished and await stream.next() is None

    asyncio.run(main())


def test_a_stream_of_several_requests_ends_when_the_last_finishes() -> None:
    import asyncio

    from cadence.server.frame_stream import FrameStream

    async def main() -> None:
        stream = FrameStream(2)
        _outputs_of(stream, (0, "data: 0\n\n", False), (1, "data: 1\n\n", False),
                    (0, "data: 0 end\n\n", True))
        assert not stream.finished
        assert await stream.next() == "data: 0\n\ndata: 1\n\ndata: 0 end\n\n"
        later = asyncio.ensure_future(stream.next())  # waits for the other request
        await asyncio.sleep(0)
        assert not later.done()
        _outputs_of(stream, (1, "data: 1 end\n\n", True))
        assert await later == "data: 1 end\n\n"
        assert stream.finished and await stream.next() is None

    asyncio.run(main())


@pytest.mark.parametrize("cached", [None, 0, 4])
def test_streamed_usage_shows_cached_tokens_as_the_whole_answers_usage_does(cached) -> None:
    """--enable-prompt-tokens-details with nothing from the prefix cache: neither the streamed
    usage nor a whole answer's shows prompt_tokens_details (0 is left out as None is)."""
    from cadence.server.protocol_responses import UsageInfo

    whole = UsageInfo.of(10, 5, cached).model_dump(mode="json")
    for frames in (CompletionFrames("cmpl-1", "m", created=1), ChatFrames("c-1", "m", created=1)):
        assert _frame_json(frames.usage(10, 5, cached))["usage"] == whole
