"""POST /v1/chat/completions."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from cadence.server.chat_template import render_chat
from cadence.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatLogProb,
    ChatLogProbs,
    ChatLogProbsContent,
    ChatResponseMessage,
    DeltaMessage,
    ParamError,
    UsageInfo,
    random_id,
)
from cadence.server.serving import (
    DONE_FRAME,
    OpenAIServing,
    StartedRequest,
    clamp_logprob,
    stream_error_frame,
    to_bad_request,
    token_text,
    top_by_rank,
)

if TYPE_CHECKING:
    from cadence.outputs import Logprob


def chat_logprobs(token_ids: list[int], rows: list[dict[int, Logprob]], num: int) -> ChatLogProbs:
    content: list[ChatLogProbsContent] = []
    for tid, row in zip(token_ids, rows, strict=False):
        sampled = row.get(tid)
        text = token_text(tid, sampled) if sampled is not None else f"token_id:{tid}"
        top = [
            ChatLogProb(
                token=token_text(t, lp),
                logprob=clamp_logprob(lp.logprob),
                bytes=list(token_text(t, lp).encode("utf-8")),
            )
            for t, lp in top_by_rank(row, num)
        ]
        content.append(
            ChatLogProbsContent(
                token=text,
                logprob=clamp_logprob(sampled.logprob) if sampled is not None else -9999.0,
                bytes=list(text.encode("utf-8")),
                top_logprobs=top,
            )
        )
    return ChatLogProbs(content=content)


class OpenAIServingChat(OpenAIServing):
    async def start_chat(self, request: ChatCompletionRequest, request_id: str) -> StartedRequest:
        max_tokens_param = (
            "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
        )
        try:
            prompt_ids = await self.engine.run_in_executor(
                render_chat,
                self.engine.tokenizer,
                request.messages,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                chat_template_kwargs=request.chat_template_kwargs,
                check_text=self.engine.input_processor.check_prompt_text,
            )
        except ParamError:
            raise
        except ValueError as exc:  # a rendered text too long for the context
            raise to_bad_request(exc, "messages", max_tokens_param) from exc
        return await self.start(
            request_id,
            {"prompt_token_ids": prompt_ids},
            request.to_sampling_params(),
            priority=request.priority,
            prompt_param="messages",
            max_tokens_param=max_tokens_param,
        )

    async def create(
        self, request: ChatCompletionRequest, request_id: str | None = None
    ) -> ChatCompletionResponse:
        request_id = request_id or random_id("chatcmpl")
        started = await self.start_chat(request, request_id)
        final = await self.final_output(started)
        c = final.outputs[0]
        lps = None
        if request.logprobs and c.logprobs is not None:
            lps = chat_logprobs(c.token_ids, c.logprobs, request.top_logprobs or 0)
        prompt_tokens = len(final.prompt_token_ids or [])
        return ChatCompletionResponse(
            id=request_id,
            model=self.served_model_name,
            choices=[
                ChatCompletionResponseChoice(
                    index=0,
                    message=ChatResponseMessage(content=c.text),
                    logprobs=lps,
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                )
            ],
            usage=UsageInfo(
                prompt_tokens=prompt_tokens,
                completion_tokens=len(c.token_ids),
                total_tokens=prompt_tokens + len(c.token_ids),
            ),
        )

    def _frame(
        self,
        request_id: str,
        delta: DeltaMessage,
        *,
        logprobs: ChatLogProbs | None = None,
        finish_reason: str | None = None,
        stop_reason: int | str | None = None,
        usage: UsageInfo | None = None,
    ) -> str:
        chunk = ChatCompletionStreamResponse(
            id=request_id,
            model=self.served_model_name,
            choices=[
                ChatCompletionStreamChoice(
                    index=0,
                    delta=delta,
                    logprobs=logprobs,
                    finish_reason=finish_reason,
                    stop_reason=stop_reason,
                )
            ],
            usage=usage,
        )
        data: dict[str, Any] = chunk.model_dump(mode="json")
        # A delta carries only what changed (no "role": null on content chunks).
        data["choices"][0]["delta"] = delta.model_dump(mode="json", exclude_none=True)
        return f"data: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n"

    async def stream(
        self, request: ChatCompletionRequest, started: StartedRequest
    ) -> AsyncGenerator[str, None]:
        """SSE frames of a streamed chat completion; always ends with ``[DONE]``."""
        rid = started.request_id
        prompt_tokens = completion_tokens = 0
        finished = False
        gen = self.outputs(started)
        try:
            yield self._frame(rid, DeltaMessage(role="assistant", content=""))
            async for out in gen:
                c = out.outputs[0]
                prompt_tokens = len(out.prompt_token_ids or [])
                completion_tokens += len(c.token_ids)
                finished = out.finished
                lps = None
                if request.logprobs and c.logprobs is not None and c.token_ids:
                    lps = chat_logprobs(c.token_ids, c.logprobs, request.top_logprobs or 0)
                if not c.text and not finished and lps is None:
                    continue  # nothing visible yet (held back for a possible stop string)
                usage = (
                    _usage(prompt_tokens, completion_tokens) if request.continuous_usage else None
                )
                yield self._frame(
                    rid,
                    DeltaMessage(content=c.text),
                    logprobs=lps,
                    finish_reason=c.finish_reason if finished else None,
                    stop_reason=c.stop_reason if finished else None,
                    usage=usage,
                )
            if request.include_usage:
                chunk = ChatCompletionStreamResponse(
                    id=rid,
                    model=self.served_model_name,
                    choices=[],
                    usage=_usage(prompt_tokens, completion_tokens),
                )
                yield f"data: {chunk.model_dump_json()}\n\n"
        except Exception as exc:
            yield stream_error_frame(exc)
        finally:
            await gen.aclose()
            if not finished:
                self.abort([rid])
        yield DONE_FRAME


def _usage(prompt: int, completion: int) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )
