"""POST /v1/completions."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING

from cadence.server.frame_stream import FrameStream
from cadence.server.frames import CompletionFrames
from cadence.server.protocol import random_id
from cadence.server.protocol_completion import CompletionRequest
from cadence.server.protocol_responses import (
    CompletionLogProbs,
    CompletionResponse,
    CompletionResponseChoice,
    UsageInfo,
)
from cadence.server.serving import (
    DONE_FRAME,
    OpenAIServing,
    StartedRequest,
    clamp_logprob,
    prompt_logprobs_out,
    stream_error_frame,
    token_text,
    top_by_rank,
)
from cadence.server.text_offsets import TextCursor, next_offset

if TYPE_CHECKING:
    from cadence.engine.output_processor import OutputSink
    from cadence.outputs import CompletionOutput, Logprob, RequestOutput


class Echo:
    """What ``echo`` puts before a completion: the prompt's text, and with logprobs its tokens'
    (the first has none)."""

    def __init__(self, decode: Callable[[list[int]], str] | None, as_ids: bool = False,
                 from_ids: bool = False,
                 bytes_of: Callable[[int, str], list[int]] | None = None) -> None:
        self.decode = decode
        self.as_ids = as_ids  # return_tokens_as_token_ids
        self.bytes_of = bytes_of  # each token's own bytes, where the tokenizer's kind tells
        # truncate_prompt_tokens: the engine saw the prompt's last tokens only, so the echo is
        # their text (which the echoed logprobs and usage count), not the prompt as sent.
        self.from_ids = from_ids

    def text(self, out: RequestOutput) -> str:
        if out.prompt is not None and not (self.from_ids and self.decode):
            return out.prompt
        return self.decode(list(out.prompt_token_ids or [])) if self.decode else ""

    def token(self, token_id: int) -> str:
        return self.decode([token_id]) if self.decode else f"token_id:{token_id}"

    def logprobs(self, out: RequestOutput, token_ids: list[int],
                 rows: list[dict[int, Logprob]] | None, num: int,
                 cursor: TextCursor | None = None) -> CompletionLogProbs:
        prompt = list(out.prompt_token_ids or [])
        prompt_rows = list(out.prompt_logprobs or [None] * len(prompt))
        return completion_logprobs(prompt + token_ids, prompt_rows + list(rows or []), num,
                                   cursor, self.token, self.decode, self.as_ids, self.bytes_of)


def completion_logprobs(
    token_ids: list[int], rows: list[dict[int, Logprob] | None], num: int | None,
    cursor: TextCursor | None = None,
    decode: Callable[[int], str] | None = None,
    decode_ids: Callable[[list[int]], str] | None = None,
    as_ids: bool = False,
    bytes_of: Callable[[int, str], list[int]] | None = None,
) -> CompletionLogProbs:
    """OpenAI legacy logprobs: the sampled token plus the ``num`` most likely per position. A
    row of None (the first prompt token, echoed) has no logprob: its text comes from
    ``decode``. ``text_offset`` is where each token's text starts in the completion's text
    (``text_offsets.next_offset``: by each token's bytes with ``bytes_of``, else by text
    decoded with ``decode_ids``, else each token's shown length, as vLLM does); a special token
    that the text skips still counts its shown length (vLLM's offsets). ``cursor``: where the
    first token starts and the incomplete character before it (a fresh one: the start of the
    text); updated in place. ``as_ids``: tokens shown as ``token_id:N`` (vLLM's
    return_tokens_as_token_ids); the offsets still count the text."""
    out = CompletionLogProbs()
    if cursor is None:
        cursor = TextCursor()
    for tid, row in zip(token_ids, rows, strict=False):
        if row is None:
            text = decode(tid) if decode is not None else f"token_id:{tid}"
            out.tokens.append(f"token_id:{tid}" if as_ids else text)
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
        else:
            sampled = row.get(tid)
            text = token_text(tid, sampled) if sampled is not None else f"token_id:{tid}"
            shown = f"token_id:{tid}" if as_ids else text
            out.tokens.append(shown)
            out.token_logprobs.append(
                clamp_logprob(sampled.logprob) if sampled is not None else None)
            # The sampled token first, then the most likely (vLLM's order; one entry each).
            top = {} if sampled is None else {shown: clamp_logprob(sampled.logprob)}
            for t, lp in top_by_rank(row, num):
                top.setdefault(token_text(t, lp, as_ids), clamp_logprob(lp.logprob))
            out.top_logprobs.append(top)
        out.text_offset.append(next_offset(cursor, tid, text, bytes_of, decode_ids))
    return out


def generated_nothing(c: CompletionOutput) -> CompletionOutput:
    """``c`` as an echo of the prompt alone shows it: the one token computed left out, ended by
    the length of zero tokens asked for."""
    return dataclasses.replace(c, text="", token_ids=[], logprobs=None, cumulative_logprob=None,
                               finish_reason="length" if c.finished() else None,
                               stop_reason=None)


class CompletionStream:
    """A streamed completion: its frame stream and the renderer of each prompt's outputs."""

    def __init__(self, request: CompletionRequest, base_id: str, model: str,
                 with_ids: bool, echo: Echo) -> None:
        n = len(request.prompts())
        choices = n * request.n  # choice i * request.n + k: prompt i's k-th completion
        self.request = request
        self.frames = CompletionFrames(base_id, model)
        self.stream = FrameStream(n)
        self.with_ids = with_ids
        self.prompt_tokens = [0] * n
        self.cached_tokens = [0] * n
        self.completion_tokens = [0] * n
        self.choice_tokens = [0] * choices  # continuous usage counts each choice's own (vLLM)
        self.cursors = [TextCursor() for _ in range(choices)]
        self.finished = [False] * n
        # With return_token_ids, each choice's first chunk carries its prompt's ids.
        self.prompt_ids_due = [request.return_token_ids] * choices
        self.echo_due = [request.echo] * choices
        self.echo = echo

    def sink(self, i: int) -> OutputSink:
        request, frames = self.request, self.frames

        def render(out: RequestOutput) -> str | None:
            c = out.outputs[0]
            k = i * request.n + c.index  # the choice
            if request.echo_only:
                c = generated_nothing(c)
            self.prompt_tokens[i] = len(out.prompt_token_ids or [])
            self.cached_tokens[i] = out.num_cached_tokens or 0
            self.completion_tokens[i] += len(c.token_ids)
            self.choice_tokens[k] += len(c.token_ids)
            self.finished[i] = out.finished
            lps = None
            text = c.text
            if self.echo_due[k]:
                self.echo_due[k] = False
                text = self.echo.text(out) + text
                if request.logprobs is not None:
                    lps = self.echo.logprobs(out, list(c.token_ids), c.logprobs,
                                             request.logprobs, self.cursors[k])
            elif request.logprobs is not None and c.logprobs is not None and c.token_ids:
                lps = completion_logprobs(c.token_ids, c.logprobs, request.shown_logprobs,
                                          self.cursors[k], decode_ids=self.echo.decode,
                                          as_ids=self.echo.as_ids, bytes_of=self.echo.bytes_of)
            ids = list(c.token_ids) if self.with_ids else None
            if not text and not ids and not c.finished() and lps is None:
                return None  # nothing visible yet (held back for a possible stop string)
            usage = None
            if request.continuous_usage:
                usage = (self.prompt_tokens[i], self.choice_tokens[k])
            prompt_ids = None
            if self.prompt_ids_due[k]:
                self.prompt_ids_due[k] = False
                prompt_ids = list(out.prompt_token_ids or [])
            return frames.chunk(
                k,
                text,
                logprobs=lps,
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
                token_ids=ids,
                usage=usage,
                prompt_token_ids=prompt_ids,
            )

        return self.stream.sink(render)


class OpenAIServingCompletion(OpenAIServing):
    def new_stream(self, request: CompletionRequest, base_id: str) -> CompletionStream:
        return CompletionStream(request, base_id, self.shown_model(request.model),
                                self._with_ids(request), self._echo(request))

    async def start_all(
        self, request: CompletionRequest, base_id: str, stream: CompletionStream | None = None
    ) -> list[StartedRequest]:
        prompts = request.prompts()
        params = await self.engine.run_cpu(request.params_size, request.to_sampling_params,
                                           self.engine.generation_defaults)
        started: list[StartedRequest] = []
        try:
            for i, prompt in enumerate(prompts):
                rid = base_id if len(prompts) == 1 else f"{base_id}-{i}"
                started.append(
                    await self.start(
                        rid,
                        prompt,
                        params,
                        priority=request.priority,
                        prompt_param="prompt",
                        max_tokens_param="max_tokens",
                        grammar_param=request.grammar_param,
                        index=i,
                        sink=stream.sink(i) if stream is not None else None,
                        beam_width=request.n if request.use_beam_search else 0,
                        length_penalty=request.length_penalty,
                    )
                )
        except BaseException:
            self.abort([s.request_id for s in started])
            raise
        return started

    async def create(
        self, request: CompletionRequest, base_id: str | None = None,
        response_id: str | None = None,
    ) -> CompletionResponse:
        """``base_id``: the engine's id of the request (of its first prompt's);
        ``response_id``: the response's, when it differs."""
        base_id = base_id or random_id("cmpl")
        started = await self.start_all(request, base_id)
        echo = self._echo(request)
        choices: list[CompletionResponseChoice] = []
        prompt_tokens = completion_tokens = cached = 0
        try:
            for s in started:
                final = await self.final_output(s, request.grammar_param)
                for c in final.outputs:
                    if request.echo_only:
                        c = generated_nothing(c)
                    choices.append(self._choice(request, final, c, s.index * request.n, echo))
                    completion_tokens += len(c.token_ids)
                    await asyncio.sleep(0)  # NOTE: a turn for the loop between choices
                prompt_tokens += len(final.prompt_token_ids or [])
                cached += final.num_cached_tokens or 0
        except BaseException:
            self.abort([s.request_id for s in started])  # the others of a multi-prompt request
            raise
        return CompletionResponse(
            id=response_id or base_id, model=self.shown_model(request.model), choices=choices,
            usage=UsageInfo.of(prompt_tokens, completion_tokens, self.shown_cached_tokens(cached)),
        )

    def _choice(self, request: CompletionRequest, final: RequestOutput, c: CompletionOutput,
                first_index: int, echo: Echo) -> CompletionResponseChoice:
        lps = None
        text = c.text
        if request.echo:
            text = echo.text(final) + text
            if request.logprobs is not None:
                lps = echo.logprobs(final, list(c.token_ids), c.logprobs, request.logprobs)
        elif request.logprobs is not None and c.logprobs is not None:
            lps = completion_logprobs(c.token_ids, c.logprobs, request.shown_logprobs,
                                      decode_ids=echo.decode, as_ids=echo.as_ids,
                                      bytes_of=echo.bytes_of)
        return CompletionResponseChoice(
            index=first_index + c.index,
            text=text,
            logprobs=lps,
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
            token_ids=list(c.token_ids) if self._with_ids(request) else None,
            prompt_token_ids=(list(final.prompt_token_ids or [])
                              if request.return_token_ids else None),
            prompt_logprobs=(prompt_logprobs_out(final.prompt_logprobs, request.prompt_logprobs,
                                                 final.prompt_token_ids)
                             if request.prompt_logprobs is not None else None),
        )

    def _echo(self, request: CompletionRequest) -> Echo:
        tok = self.engine.tokenizer
        if tok is None:
            return Echo(None, request.return_tokens_as_token_ids)
        tb = self.token_bytes
        return Echo(tok.decode, request.return_tokens_as_token_ids,
                    from_ids=request.truncate_prompt_tokens is not None,
                    bytes_of=tb.bytes_of if tb.kind is not None else None)

    def _with_ids(self, request: CompletionRequest) -> bool:
        return request.return_token_ids or self.engine.tokenizer is None

    async def stream(
        self, started: list[StartedRequest], cs: CompletionStream
    ) -> AsyncGenerator[str, None]:
        """SSE frames of a streamed completion; always ends with ``[DONE]``."""
        try:
            while (frames := await cs.stream.next()) is not None:
                yield frames
            if cs.stream.error is not None:
                yield stream_error_frame(cs.stream.error, cs.request.grammar_param)
            elif cs.request.include_usage:
                yield cs.frames.usage(sum(cs.prompt_tokens), sum(cs.completion_tokens),
                                      self.shown_cached_tokens(sum(cs.cached_tokens)))
        except Exception as exc:
            yield stream_error_frame(exc)
        finally:
            unfinished = [s.request_id for s, f in zip(started, cs.finished, strict=True) if not f]
            self.abort(unfinished)
        yield DONE_FRAME

