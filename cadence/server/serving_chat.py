"""POST /v1/chat/completions."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from cadence.engine.frontend import reasoning_tag_ids
from cadence.engine.truncation import kept_tokens, truncation_length
from cadence.server.chat_stream import ChatStream, chat_logprobs, forced_calls, one_call_at_most
from cadence.server.chat_template import render_chat, request_template
from cadence.server.protocol import ParamError, random_id
from cadence.server.protocol_chat import (
    ChatCompletionRequest,
    FunctionCall,
    ToolCall,
)
from cadence.server.protocol_responses import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatResponseMessage,
    UsageInfo,
)
from cadence.server.reasoning import ReasoningParser, reasoning_tokens
from cadence.server.serving import (
    DONE_FRAME,
    OpenAIServing,
    StartedRequest,
    prompt_logprobs_out,
    stream_error_frame,
    to_bad_request,
)
from cadence.server.tool_calls import (
    KEEPS_SPECIAL_TOKENS,
    ParsedCall,
    tool_call_stream,
    tool_calls_finish,
)
from cadence.worker.grammar import reasoning_open


class OpenAIServingChat(OpenAIServing):
    chat_template: str | None = None  # the server's (--chat-template), else the tokenizer's
    trust_request_chat_template = False  # a request may carry its own template
    content_format = "auto"  # --chat-template-content-format
    reasoning: ReasoningParser | None = None  # --reasoning-parser
    tool_call_parser: str | None = None  # with --enable-auto-tool-choice
    default_chat_template_kwargs: Mapping[str, Any] | None = None  # the server's

    def _template(self, request: ChatCompletionRequest) -> str | None:
        """The template to render ``request`` with: its own (where trusted), else the server's."""
        return request_template(request.chat_template, self.chat_template,
                                self.trust_request_chat_template, request.chat_template_kwargs)

    def parses_tools(self, request: ChatCompletionRequest) -> bool:
        """Whether this request's answer is searched for tool calls (tool_choice "auto")."""
        if not request.tools or request.tool_choice == "none" or request.forced_tools:
            return False
        if self.tool_call_parser is None:
            raise ParamError(
                "tool_choice", '"auto" tool choice requires --enable-auto-tool-choice and '
                "--tool-call-parser to be set.")
        return True

    def new_stream(self, request: ChatCompletionRequest, request_id: str) -> ChatStream:
        parser = self.tool_call_parser if self.parses_tools(request) else None
        return ChatStream(request, request_id, self.shown_model(request.model), self.reasoning,
                          parser, self.token_bytes, self.reasoning_tags, self.tool_call_parser)

    @functools.cached_property
    def reasoning_tags(self) -> tuple[int, int] | None:  # type: ignore[override]
        """The reasoning parser's tags as token ids, where the tokenizer has each as one token
        (vLLM requires that); None otherwise, and the grammar applies from the first token."""
        return reasoning_tag_ids(self.engine.tokenizer,
                                 None if self.reasoning is None else self.reasoning.name)

    async def start_chat(
        self, request: ChatCompletionRequest, request_id: str, stream: ChatStream | None = None
    ) -> StartedRequest:
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
                chat_template_kwargs=request.template_kwargs(),
                check_text=(self.engine.input_processor.check_prompt_text
                            if request.truncate_prompt_tokens is None else None),
                chat_template=self._template(request),
                tools=([t.model_dump(exclude_none=True) for t in request.tools]
                       if request.tools else None),
                documents=request.documents,
                content_format=self.content_format,
            )
        except ParamError:
            raise
        except ValueError as exc:  # a rendered text too long for the context
            raise to_bad_request(exc, "messages", max_tokens_param) from exc
        params = await self.engine.run_cpu(request.params_size, request.to_sampling_params,
                                           self.engine.generation_defaults)
        if self.tool_call_parser in KEEPS_SPECIAL_TOKENS and self.parses_tools(request):
            params.skip_special_tokens = False  # the parser's tag is a special token (vLLM)
        if stream is not None:
            # The role chunks' prompt ids and continuous usage: the prompt as the engine keeps
            # it (the tokens truncate_prompt_tokens leaves, as the engine cuts it).
            k = request.truncate_prompt_tokens
            kept = len(prompt_ids) if k is None else min(
                len(prompt_ids), truncation_length(k, self.engine.max_model_len,
                                                   params.max_tokens))
            stream.prompt_tokens = kept
            if request.return_token_ids:
                stream.prompt_token_ids = kept_tokens(prompt_ids, kept, params.truncation_side)
        ended = self.reasoning_ended(request, prompt_ids)
        if params.structured_outputs is not None and (
                self.reasoning_tags is None or not request.include_reasoning):
            # The grammar applies from the first token (tags the tokenizer splits cannot gate
            # it; a request without reasoning asks for that, vLLM's resolve_reasoning_ended),
            # so the constrained output (a forced tool call, a JSON answer) is all content.
            ended = True
        if stream is not None and ended and stream.reasoning is not None:
            stream.reasoning_ended = True
            for splitter in stream.reasoning:
                splitter.end_reasoning()
        if (params.structured_outputs is not None and self.reasoning_tags is not None
                and not ended):
            # vLLM: under a reasoning parser the grammar applies to the answer, after reasoning.
            params.structured_outputs = dataclasses.replace(
                params.structured_outputs, reasoning_tags=self.reasoning_tags)
        started = await self.start(
            request_id,
            {"prompt_token_ids": prompt_ids, "cache_salt": request.cache_salt},
            params,
            priority=request.priority,
            prompt_param="messages",
            max_tokens_param=max_tokens_param,
            logprobs_param="top_logprobs",
            grammar_param=request.grammar_param,
            sink=stream.sink() if stream is not None else None,
            beam_width=request.n if request.use_beam_search else 0,
            length_penalty=request.length_penalty,
        )
        started.reasoning_ended = ended
        started.skip_special_tokens = params.skip_special_tokens
        return started

    def reasoning_ended(self, request: ChatCompletionRequest, prompt_ids: list[int]) -> bool:
        """Whether the answer has no reasoning (vLLM's prompt_is_reasoning_end): the prompt's
        last reasoning tag closes it (a template that turned thinking off), or the parser's
        switch (qwen3's enable_thinking) is off."""
        parser = self.reasoning
        if parser is None:
            return False
        if parser.thinking_off(request.template_kwargs()):
            return True
        tags = self.reasoning_tags
        if tags is not None:  # by id, as the grammar reads the prompt
            return not reasoning_open(prompt_ids, tags)
        # Tags of several tokens: the prompt's tail as text (a template closes it at the end).
        start, end = parser.tags
        tail = self.engine.tokenizer.decode(prompt_ids[-64:])
        return tail.rfind(end) > tail.rfind(start)

    async def create(
        self, request: ChatCompletionRequest, request_id: str | None = None,
        response_id: str | None = None,
    ) -> ChatCompletionResponse:
        """``request_id``: the engine's id; ``response_id``: the response's, when it differs."""
        request_id = request_id or random_id("chatcmpl")
        tools = self.parses_tools(request)
        started = await self.start_chat(request, request_id)
        final = await self.final_output(started, request.grammar_param)
        role = request.answer_role(self.options.response_role)
        echoed = request.echoed(role)
        choices = []
        completion_tokens = 0
        # Under a reasoning parser the usage counts the reasoning's tokens, whether shown or
        # not (vLLM's completion_tokens_details).
        reasoning_tokens = 0 if self.reasoning is not None else None
        hidden = self.reasoning is not None and not request.include_reasoning
        for c in final.outputs:
            lps = None
            if request.logprobs and c.logprobs is not None:
                lps = chat_logprobs(c.token_ids, c.logprobs, request.shown_logprobs,
                                     request.return_tokens_as_token_ids, self.token_bytes)
            content, reasoning = c.text, None
            if self.reasoning is not None:
                reasoning, content = self.reasoning.split(c.text, started.reasoning_ended)
            calls: list[ToolCall] = []
            finish = c.finish_reason
            parsed: list[ParsedCall] | None = None
            if request.forced_tools:  # the calls are the content's JSON, after any reasoning
                parsed = forced_calls(request, content or "", self.tool_call_parser)
                content = "" if parsed or not reasoning else None  # as the stream's, above
                if parsed is not None and request.tool_choice == "required" and finish == "stop":
                    finish = "tool_calls"  # vLLM's: not where max_tokens ended it ("length")
            elif tools and content is not None:
                assert self.tool_call_parser is not None  # parses_tools said so
                splitter = tool_call_stream(self.tool_call_parser)
                content, parsed = splitter.feed(content, final=True)
                content = content or None
                finish = tool_calls_finish(finish, splitter)
            calls = [ToolCall(id=p.id, function=FunctionCall(name=p.name, arguments=p.arguments))
                     for p in one_call_at_most(request, parsed or [])]
            if echoed:
                content = echoed + (content or "")
            if hidden:  # vLLM: split off, then left out with the per-token fields showing it
                reasoning = lps = None
            choices.append(ChatCompletionResponseChoice(
                index=c.index,
                message=ChatResponseMessage(role=role, content=content, reasoning=reasoning,
                                            tool_calls=calls),
                logprobs=lps,
                finish_reason=finish,
                stop_reason=c.stop_reason,
                token_ids=list(c.token_ids) if request.return_token_ids and not hidden else None,
            ))
            completion_tokens += len(c.token_ids)
            if reasoning_tokens is not None:
                reasoning_tokens += self.count_reasoning(c.token_ids, c.text, started)
            await asyncio.sleep(0)  # NOTE: a turn for the loop between choices (n may be 128)
        prompt_tokens = len(final.prompt_token_ids or [])
        return ChatCompletionResponse(
            id=response_id or request_id,
            model=self.shown_model(request.model),
            choices=choices,
            prompt_token_ids=(list(final.prompt_token_ids or [])
                              if request.return_token_ids else None),
            prompt_logprobs=(prompt_logprobs_out(final.prompt_logprobs)
                             if request.prompt_logprobs is not None else None),
            usage=UsageInfo.of(prompt_tokens, completion_tokens,
                               self.shown_cached_tokens(final.num_cached_tokens),
                               reasoning_tokens),
        )

    def count_reasoning(self, ids: list[int], text: str, started: StartedRequest) -> int:
        """A whole answer's reasoning tokens (``cadence.server.reasoning.reasoning_tokens``:
        by the tags' ids, or where the tokenizer splits them by the tokens' texts)."""
        def decode(prefix: Sequence[int]) -> str:
            return self.engine.tokenizer.decode(
                list(prefix), skip_special_tokens=started.skip_special_tokens)

        return reasoning_tokens(ids, text, self.reasoning_tags, started.reasoning_ended,
                                decode)

    async def stream(self, started: StartedRequest, cs: ChatStream) -> AsyncGenerator[str, None]:
        """SSE frames of a streamed chat completion; always ends with ``[DONE]``."""
        try:
            role = cs.request.answer_role(self.options.response_role)
            echoed = cs.request.echoed(role)
            usage = (cs.prompt_tokens, 0) if cs.request.continuous_usage else None
            none_yet = 0 if usage is not None and cs.reasoning_counts is not None else None
            for index in range(cs.n):
                yield cs.frames.chunk(role=role, content="", index=index,
                                      prompt_token_ids=cs.prompt_token_ids, usage=usage,
                                      reasoning_tokens=none_yet)
                if echoed:
                    yield cs.frames.chunk(content=echoed, index=index, usage=usage,
                                          reasoning_tokens=none_yet)
            while (frames := await cs.stream.next()) is not None:
                yield frames
            if cs.stream.error is not None:
                yield stream_error_frame(cs.stream.error, cs.request.grammar_param)
            elif cs.request.include_usage:
                yield cs.frames.usage(cs.prompt_tokens, cs.completion_tokens,
                                      self.shown_cached_tokens(cs.cached_tokens),
                                      cs.reasoning_tokens())
        except Exception as exc:
            yield stream_error_frame(exc)
        finally:
            if not cs.finished:
                self.abort([started.request_id])
        yield DONE_FRAME

