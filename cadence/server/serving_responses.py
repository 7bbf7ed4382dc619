"""POST /v1/responses over the chat endpoint's machinery: a whole ``Response`` object, or its
stream of typed events (``response.created``, an item's ``output_item.added``, its text or
reasoning or arguments deltas and ``.done`` events, ``response.completed``), token by token as
the chat stream renders them."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from cadence.server.chat_stream import ChatStream
from cadence.server.errors import APIError
from cadence.server.protocol import ParamError
from cadence.server.protocol_chat import NamedToolChoice
from cadence.server.responses_api import ResponsesRequest
from cadence.server.responses_objects import (
    call_item,
    created_now,
    message_item,
    new_item_id,
    reasoning_item,
    reasoning_part,
    response_object,
    text_part,
    usage_object,
)
from cadence.server.serving import StartedRequest, stream_error
from cadence.server.tool_call_json import CHAT_CALL_PREFIX

if TYPE_CHECKING:
    from cadence.server.serving_chat import OpenAIServingChat

__all__ = ["OpenAIServingResponses", "ResponseBody", "ResponseEvents"]


class ResponseBody(BaseModel):
    """A ``Response`` object as built (its fields are ``response_object``'s)."""

    model_config = ConfigDict(extra="allow")


class ResponseEvents:
    """The events of one streamed response. ``chunk`` takes what ``ChatFrames.chunk`` takes, so
    that a ``ChatStream`` renders into it: each piece of reasoning, text or a whole tool call
    becomes its events, an item opened when its first piece comes and closed when another kind
    of item starts or the answer ends."""

    def __init__(self, request: ResponsesRequest, response_id: str, model: str,
                 defaults: Mapping[str, Any], source: ChatStream) -> None:
        self.request = request
        self.defaults = defaults  # the model's sampling defaults, as the response shows them
        self.response_id = response_id
        self.model = model
        self.created_at = created_now()
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # closed items, for the final response
        self._open: dict[str, Any] | None = None  # the item receiving deltas
        self._text: list[str] = []
        self._logprobs: list[dict[str, Any]] = []
        self._held_logprobs: list[dict[str, Any]] = []  # before the text they belong to
        self._after_reasoning = False  # the output's reasoning has ended (its end tag seen)
        # The chat stream rendering into this: the engine's own finish reason and where the
        # reasoning stands, which the chat chunk's fields do not carry.
        self.source = source
        self.finish_reason: str | None = None
        self.head = ""  # ``start()``'s events, once made
        self.final: dict[str, Any] = {}  # the whole response, once ``end`` made it

    def _event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self.output)}

    def _response(self, status: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        return response_object(self.request, self.response_id, self.model, self.created_at,
                               list(self.output), usage, status, self.defaults)

    def start(self) -> str:
        """The opening events. NOTE: made before the request starts, so that they number
        before any output's (the sink renders outputs as they come, before the response task
        first runs)."""
        head = self._response("in_progress")
        return (self._event("response.created", response=head)
                + self._event("response.in_progress", response=head))

    @property
    def _status(self) -> str:
        """The answer's (and its message's) status: a max_output_tokens cut is incomplete
        (the engine's finish reason: also where a tool call parser made it "tool_calls")."""
        return "incomplete" if self.finish_reason == "length" else "completed"

    def _open_item(self, item: dict[str, Any]) -> str:
        self._open = item
        self._text, self._logprobs = [], []
        return self._event("response.output_item.added", output_index=len(self.output),
                           item=item)

    def _finished_item(self, status: str) -> dict[str, Any]:
        """The open item with what it received, its status ``status`` (a call's: "completed"
        unless it is a named function's, whose arguments are the whole answer; other parsers
        give calls whole and drop a cut one)."""
        item = self._open
        assert item is not None
        text = "".join(self._text)
        if item["type"] == "reasoning":
            return reasoning_item(item["id"], text)
        if item["type"] == "function_call":
            forced = isinstance(self.request.chat.tool_choice, NamedToolChoice)
            return call_item(item["id"], item["call_id"], item["name"], text,
                             status if forced else "completed")
        lps = self._logprobs if self.request.logprobs_wanted else None
        return message_item(item["id"], text, status, lps)

    def _close(self) -> str:
        item = self._open
        if item is None:
            return ""
        text = "".join(self._text)
        done = self._finished_item(self._status)
        out = []
        if item["type"] == "reasoning":
            out.append(self._event("response.reasoning_text.done", **self._where(),
                                   content_index=0, text=text))
            out.append(self._event("response.content_part.done", **self._where(),
                                   content_index=0, part=reasoning_part(text)))
        elif item["type"] == "message":
            lps = self._logprobs if self.request.logprobs_wanted else None
            out.append(self._event("response.output_text.done", **self._where(),
                                   content_index=0, text=text, logprobs=lps or []))
            out.append(self._event("response.content_part.done", **self._where(),
                                   content_index=0, part=text_part(text, lps)))
        out.append(self._event("response.output_item.done", output_index=len(self.output),
                               item=done))
        self.output.append(done)
        self._open = None
        return "".join(out)

    def _reasoning(self, text: str) -> str:
        out = ""
        if self._open is None or self._open["type"] != "reasoning":
            out = self._close() + self._open_item(reasoning_item(new_item_id("rs"), None))
            out += self._event("response.content_part.added", **self._where(),
                               content_index=0, part=reasoning_part(""))
        self._text.append(text)
        return out + self._event("response.reasoning_text.delta", **self._where(),
                                 content_index=0, delta=text)

    def _open_message(self) -> str:
        """Close the open item; open a message and its (one) text part."""
        out = self._close() + self._open_item(message_item(new_item_id("msg"), None,
                                                           "in_progress"))
        return out + self._event("response.content_part.added", **self._where(),
                                 content_index=0, part=text_part("", None))

    def _message(self, text: str, logprobs: list[dict[str, Any]]) -> str:
        out = ""
        if self._open is None or self._open["type"] != "message":
            out = self._open_message()
        self._text.append(text)
        self._logprobs.extend(logprobs)
        return out + self._event("response.output_text.delta", **self._where(),
                                 content_index=0, delta=text, logprobs=logprobs)

    def _call(self, call: dict[str, Any]) -> str:
        fn = call["function"]
        item_id = new_item_id("fc")
        # OpenAI's call ids read call_...; a parser's own form (Mistral's nine characters,
        # which its templates check when the call comes back) stays.
        call_id = call["id"]
        if call_id.startswith(CHAT_CALL_PREFIX):
            call_id = "call_" + call_id.removeprefix(CHAT_CALL_PREFIX)
        out = self._close() + self._open_item(call_item(item_id, call_id, fn["name"], "",
                                                        "in_progress"))
        where = self._where()
        out += self._event("response.function_call_arguments.delta", **where,
                           delta=fn["arguments"])
        out += self._event("response.function_call_arguments.done", **where,
                           arguments=fn["arguments"])
        # NOTE: left open until the next item or the end: whether the answer was cut after
        # it (its status) is known only then.
        self._text.append(fn["arguments"])
        return out

    def chunk(self, *, content: str | None = None, reasoning: str | None = None,
              tool_calls: list[dict] | None = None, logprobs: BaseModel | None = None,
              finish_reason: str | None = None, **_: Any) -> str:
        out = []
        lps = ([c.model_dump(mode="json") for c in getattr(logprobs, "content", None) or []]
               if self.request.logprobs_wanted else [])
        if reasoning:
            self._held_logprobs = []  # they were the reasoning's
            out.append(self._reasoning(reasoning))
        if content or (lps and self._open is not None and self._open["type"] == "message"):
            out.append(self._message(content or "", self._held_logprobs + lps))
            self._held_logprobs = []
        elif lps and not reasoning and (self._open is None or self._open["type"] != "reasoning"
                                        or self._after_reasoning):
            # Tokens that show nothing yet (a piece of a character): the next text's. Those
            # of the piece that ended the reasoning are its end tag's, which no item shows.
            self._held_logprobs.extend(lps)
        if self.source.reasoning_done(0):
            self._after_reasoning = True
        for call in tool_calls or []:
            out.append(self._call(call))
        if finish_reason is not None:  # the engine's, where a tool parser renamed it
            self.finish_reason = self.source.last_finish
        return "".join(out)

    def end(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None,
            reasoning_tokens: int = 0) -> str:
        """The closing events: the open item's, an empty message for an empty answer, then the
        whole response (also kept as ``final``), its usage with the answer's reasoning tokens
        (``ChatStream.reasoning_tokens``: of the generated tokens, never a text's re-encoding)."""
        out = self._close()
        if not self.output:  # an empty answer is an empty message
            out += self._open_message() + self._close()
        usage = usage_object(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens)
        self.final = self._response(self._status, usage)
        # NOTE: response.completed whatever the status (vLLM's; the openai client's stream
        # helper waits for that event), the response saying "incomplete" where it is.
        return out + self._event("response.completed", response=self.final)

    def error(self, exc: BaseException) -> str:
        """The closing events of a stream that failed: the ``error`` event, then
        ``response.failed`` with the response as it stood (its items, the open one cut; status
        "failed", its ``error`` OpenAI's: ``server_error`` for a 5xx, ``invalid_prompt`` for
        what the request's own content caused), kept as ``final``."""
        err = stream_error(exc, self.request.chat.grammar_param)
        if err.param:
            err.param = self.request.param_named(err.param)
        message = self.request.renamed(err.message)
        self.final = self._response("failed")
        if self._open is not None:  # what the open item had received, cut
            self.final["output"].append(self._finished_item("incomplete"))
        self.final["error"] = {"code": "server_error" if err.status_code >= 500
                               else "invalid_prompt", "message": message}
        return (self._event("error", code=err.type, message=message, param=err.param)
                + self._event("response.failed", response=self.final))


@contextlib.contextmanager
def _named_as_responses(request: ResponsesRequest) -> Iterator[None]:
    """An error naming a chat request's field names the Responses request's instead, in its
    parameter and in its message."""
    try:
        yield
    except ParamError as exc:
        param = request.param_named(exc.param) if exc.param else exc.param
        raise ParamError(param, request.renamed(str(exc))) from None
    except APIError as exc:
        if exc.param:
            exc.param = request.param_named(exc.param)
        exc.message = request.renamed(exc.message)
        exc.args = (exc.message,)
        raise


class OpenAIServingResponses:
    """The Responses API over the chat serving object (its model check, template, parsers)."""

    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat

    async def create(self, request: ResponsesRequest, engine_id: str,
                     response_id: str) -> ResponseBody:
        """The whole response: the stream's events made and dropped, so that a response and
        the last event of its stream are one object (items, logprobs, usage)."""
        cs, events = self.new_stream(request, response_id)
        started = await self.start(request, engine_id, cs)
        try:
            while await cs.stream.next() is not None:
                pass
        finally:
            if not cs.finished:
                self.chat.abort([started.request_id])  # the client left before the answer
        if cs.stream.error is not None:
            with _named_as_responses(request):
                raise stream_error(cs.stream.error, request.chat.grammar_param)
        events.end(cs.prompt_tokens, cs.completion_tokens,
                   cs.cached_tokens, cs.reasoning_tokens() or 0)
        return ResponseBody(**events.final)

    async def start(self, request: ResponsesRequest, engine_id: str,
                    cs: ChatStream) -> StartedRequest:
        with _named_as_responses(request):
            return await self.chat.start_chat(request.chat, engine_id, cs)

    def new_stream(self, request: ResponsesRequest, response_id: str
                   ) -> tuple[ChatStream, ResponseEvents]:
        cs = self.chat.new_stream(request.chat, response_id)
        events = ResponseEvents(request, response_id, self.chat.shown_model(request.model),
                                self.chat.engine.generation_defaults, cs)
        events.head = events.start()
        cs.frames = events  # type: ignore[assignment]  # the chat stream renders events
        return cs, events

    async def stream(self, started: StartedRequest, cs: ChatStream,
                     events: ResponseEvents) -> AsyncGenerator[str, None]:
        try:
            yield events.head
            while (frames := await cs.stream.next()) is not None:
                yield frames
            if cs.stream.error is not None:
                yield events.error(cs.stream.error)
            else:
                yield events.end(cs.prompt_tokens, cs.completion_tokens,
                                 cs.cached_tokens, cs.reasoning_tokens() or 0)
        except Exception as exc:
            yield events.error(exc)
        finally:
            if not cs.finished:
                self.chat.abort([started.request_id])
