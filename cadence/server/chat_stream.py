"""A streamed chat completion's renderer: each engine output of a choice becomes its chunk,
with the reasoning split off (``--reasoning-parser``), tool calls parsed, a forced tool choice's
calls held to the end, and logprobs in OpenAI's chat shape. The whole (non-streamed) answer
reuses the logprob and forced-call helpers here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence.server.frame_stream import FrameStream
from cadence.server.frames import ChatFrames
from cadence.server.protocol_chat import ChatCompletionRequest, NamedToolChoice
from cadence.server.protocol_responses import ChatLogProb, ChatLogProbs, ChatLogProbsContent
from cadence.server.reasoning import ReasoningCount, ReasoningParser
from cadence.server.serving import clamp_logprob, token_text, top_by_rank
from cadence.server.token_bytes import TokenBytes
from cadence.server.tool_calls import (
    ParsedCall,
    parse_forced_calls,
    tool_call_stream,
    tool_calls_finish,
)

if TYPE_CHECKING:
    from cadence.engine.output_processor import OutputSink
    from cadence.outputs import Logprob, RequestOutput

__all__ = ["ChatStream", "chat_logprobs", "forced_calls", "one_call_at_most"]


def chat_logprobs(token_ids: list[int], rows: list[dict[int, Logprob]], num: int | None,
                  as_ids: bool = False, token_bytes: TokenBytes | None = None) -> ChatLogProbs:
    """``as_ids``: tokens shown as ``token_id:N`` (vLLM's return_tokens_as_token_ids).
    ``token_bytes``: each token's own bytes where its text is part of a character (else the
    text's UTF-8)."""
    def bytes_of(tid: int, text: str) -> list[int]:
        if token_bytes is None or as_ids:
            return list(text.encode("utf-8"))
        return token_bytes.bytes_of(tid, text)

    content: list[ChatLogProbsContent] = []
    for tid, row in zip(token_ids, rows, strict=False):
        sampled = row.get(tid)
        text = token_text(tid, sampled, as_ids) if sampled is not None else f"token_id:{tid}"
        top = []
        for t, lp in top_by_rank(row, num):
            shown = token_text(t, lp, as_ids)
            top.append(ChatLogProb(token=shown, logprob=clamp_logprob(lp.logprob),
                                   bytes=bytes_of(t, shown)))
        content.append(
            ChatLogProbsContent(
                token=text,
                logprob=clamp_logprob(sampled.logprob) if sampled is not None else -9999.0,
                bytes=bytes_of(tid, text),
                top_logprobs=top,
            )
        )
    return ChatLogProbs(content=content)


def one_call_at_most(request: ChatCompletionRequest, calls: list[ParsedCall]
                     ) -> list[ParsedCall]:
    """``calls``, or only the first with ``parallel_tool_calls`` false (vLLM)."""
    return calls[:1] if request.parallel_tool_calls is False else calls


def forced_calls(request: ChatCompletionRequest, text: str, parser: str | None = None
                 ) -> list[ParsedCall] | None:
    """The calls of a forced tool choice's answer (None when it is not the calls' JSON);
    ``parser``: the server's tool-call parser (``parse_forced_calls``)."""
    choice = request.tool_choice
    return parse_forced_calls(
        text, choice.function.name if isinstance(choice, NamedToolChoice) else None, parser)


def _delta_call(index: int, call: ParsedCall) -> dict:
    """A streamed tool call, whole in one delta (OpenAI's shape)."""
    return {"index": index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


class ChatStream:
    """A streamed chat completion: its frame stream and the renderer of its outputs."""

    def __init__(self, request: ChatCompletionRequest, request_id: str, model: str,
                 reasoning: ReasoningParser | None = None, tools: str | None = None,
                 token_bytes: TokenBytes | None = None,
                 reasoning_tag_ids: tuple[int, int] | None = None,
                 server_parser: str | None = None) -> None:
        """``tools``: the tool call parser that reads this request's answers, if any;
        ``reasoning_tag_ids``: the reasoning tags' ids where each is one token (the usage's
        count of reasoning tokens goes by them); ``server_parser``: the server's tool-call
        parser, whose ids a forced choice's calls get (``parse_forced_calls``)."""
        self.request = request
        self.server_parser = server_parser
        self.token_bytes = token_bytes
        self.tools = ([tool_call_stream(tools) for _ in range(request.n)] if tools is not None
                      else None)
        # A forced tool choice: each choice's JSON is held and goes out as calls at its end.
        self.forced = [""] * request.n if request.forced_tools else None
        # One reasoning splitter per choice (text held back across pieces is per choice).
        self.reasoning = ([reasoning.stream() for _ in range(request.n)]
                          if reasoning is not None else None)
        # include_reasoning false (vLLM's): the reasoning is split off and left out, with the
        # chunks' logprobs and token ids (they would show it).
        self.hide_reasoning = reasoning is not None and not request.include_reasoning
        self.frames = ChatFrames(request_id, model)
        self.stream = FrameStream(1)
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0
        self.choice_tokens = [0] * request.n  # continuous usage counts each choice's own (vLLM)
        self.finished = False
        self.prompt_token_ids: list[int] | None = None  # set when return_token_ids
        self.n = request.n  # choices, each streamed with its index
        # Each choice's reasoning tokens, for the usage (under a reasoning parser).
        self.reasoning_counts = ([ReasoningCount(reasoning_tag_ids) for _ in range(request.n)]
                                 if reasoning is not None else None)
        self.reasoning_ended = False  # the prompt closed the reasoning: none in the output
        # The engine's finish reason of the output being rendered, before a tool call parser
        # renames it (the Responses API's status reads it).
        self.last_finish: str | None = None

    def sink(self) -> OutputSink:
        request, frames = self.request, self.frames

        def render(out: RequestOutput) -> str | None:
            c = out.outputs[0]
            self.last_finish = c.finish_reason
            self.prompt_tokens = len(out.prompt_token_ids or [])
            self.cached_tokens = out.num_cached_tokens or 0
            self.completion_tokens += len(c.token_ids)
            self.choice_tokens[c.index] += len(c.token_ids)
            self.finished = out.finished
            lps = None
            if request.logprobs and c.logprobs is not None and c.token_ids:
                lps = chat_logprobs(c.token_ids, c.logprobs, request.shown_logprobs,
                                     request.return_tokens_as_token_ids, self.token_bytes)
            ids = list(c.token_ids) if request.return_token_ids else None
            content: str | None = c.text
            reasoning = None
            if self.reasoning is not None:
                reasoning, content = self.reasoning[c.index].feed(c.text, final=c.finished())
                reasoning, content = reasoning or None, content or None
                assert self.reasoning_counts is not None  # made with the splitters
                self.reasoning_counts[c.index].feed(c.token_ids, c.text)
                if content is None and reasoning is None:
                    content = ""
            calls = None
            finish = c.finish_reason
            if self.forced is not None and (content is not None or c.finished()):
                # The calls are the answer's JSON: the content, after any reasoning.
                self.forced[c.index] += content or ""
                content = None if c.finished() else ""
                if c.finished():
                    parsed = forced_calls(request, self.forced[c.index], self.server_parser)
                    # vLLM: a forced choice's answer is its calls, never text (a "required"
                    # list cut short gives none); content is "" but beside reasoning alone.
                    content = "" if parsed or not reasoning else None
                    if parsed is not None:
                        calls = [_delta_call(i, call)
                                 for i, call in enumerate(one_call_at_most(request, parsed))]
                        if request.tool_choice == "required" and finish == "stop":
                            finish = "tool_calls"  # vLLM's: not where max_tokens ended it
            if self.tools is not None and content is not None:
                content, parsed = self.tools[c.index].feed(content, final=c.finished())
                first = len(self.tools[c.index].calls) - len(parsed)
                calls = [_delta_call(i, call) for i, call in enumerate(parsed, first)
                         if request.parallel_tool_calls is not False or i == 0] or None
                content = content or (None if reasoning or calls else "")
            if self.tools is not None:
                finish = tool_calls_finish(finish, self.tools[c.index])
            if self.hide_reasoning:
                reasoning = lps = ids = None
            if (not content and not reasoning and not calls and not c.finished() and lps is None
                    and not ids):
                return None  # nothing visible yet (held back for a possible stop string or tag)
            usage = reasoning_tokens = None
            if request.continuous_usage:
                usage = (self.prompt_tokens, self.choice_tokens[c.index])
                reasoning_tokens = self.reasoning_tokens(c.index)
            if calls and finish is not None:
                # NOTE: the finish reason in an empty chunk of its own after the calls, as
                # OpenAI frames it: the SDK's stream helper closes a call (its
                # "arguments.done") only at a chunk after the one that opened it.
                return frames.chunk(
                    content=content, reasoning=reasoning, tool_calls=calls, logprobs=lps,
                    usage=usage, reasoning_tokens=reasoning_tokens, token_ids=ids,
                    index=c.index,
                ) + frames.chunk(finish_reason=finish, stop_reason=c.stop_reason, usage=usage,
                                 reasoning_tokens=reasoning_tokens, index=c.index)
            return frames.chunk(
                content=content,
                reasoning=reasoning,
                tool_calls=calls,
                logprobs=lps,
                finish_reason=finish,
                stop_reason=c.stop_reason,
                usage=usage,
                reasoning_tokens=reasoning_tokens,
                token_ids=ids,
                index=c.index,
            )

        return self.stream.sink(render)

    def reasoning_done(self, index: int) -> bool:
        """Whether choice ``index``'s output is past its reasoning (its end tag seen, or the
        prompt ended it); True without a reasoning parser."""
        return self.reasoning is None or self.reasoning[index].state == "content"

    def reasoning_tokens(self, index: int | None = None) -> int | None:
        """Choice ``index``'s reasoning tokens so far (``ReasoningCount``), or with no index
        all choices' together; None without a reasoning parser (the usage shows no count)."""
        if self.reasoning_counts is None:
            return None
        counts = self.reasoning_counts if index is None else [self.reasoning_counts[index]]
        return sum(c.count(self.reasoning_ended) for c in counts)
