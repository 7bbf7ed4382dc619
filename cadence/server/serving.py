"""Shared plumbing of the OpenAI endpoints: model check, request start, error mapping."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from cadence.engine.core_client import EngineDeadError
from cadence.engine.input_worker import input_size
from cadence.engine.output_processor import RequestFailedError, RequestOutputCollector
from cadence.sampling_params import SamplingParams
from cadence.server.errors import (
    APIError,
    BadRequestError,
    InternalServerError,
    NotFoundError,
    ServiceUnavailableError,
)
from cadence.server.protocol_responses import (
    PromptLogprob,
    PromptLogprobs,
)
from cadence.server.serving_beam import BeamSearches
from cadence.server.settings import ResponseOptions
from cadence.server.token_bytes import TokenBytes

if TYPE_CHECKING:
    from cadence.engine.async_llm import AsyncLLM
    from cadence.engine.output_processor import OutputSink
    from cadence.outputs import Logprob, RequestOutput
    from cadence.outputs import PromptLogprobs as EnginePromptLogprobs

logger = logging.getLogger(__name__)

T = TypeVar("T")

DONE_FRAME = "data: [DONE]\n\n"
# JSON has no -inf; vLLM clamps to this floor as well.
LOGPROB_FLOOR = -9999.0

_CONTEXT_LENGTH = re.compile(r"maximum context length", re.IGNORECASE)
_LEADING_PARAM = re.compile(r"^\s*`?([a-z_][a-z0-9_]*)`?(?::|\s+(?:must|cannot|should|is|are)\b)")


@dataclass
class StartedRequest:
    """A request accepted by the engine, with where its outputs go."""

    request_id: str
    collector: OutputSink
    index: int = 0
    reasoning_ended: bool = False  # chat under a reasoning parser: the answer is all content
    skip_special_tokens: bool = True  # the sampling parameter, as the answer's text was made
    search: asyncio.Future[None] | None = None  # use_beam_search: the search's task


class OpenAIServing:
    options = ResponseOptions()  # the server's (--response-role and the like)
    # The server's reasoning parser's tags as token ids, for thinking budgets (chat derives
    # its own; ``build_app`` gives completions chat's).
    reasoning_tags: tuple[int, int] | None = None

    def __init__(self, engine: AsyncLLM, served_model_name: str,
                 aliases: tuple[str, ...] = ()) -> None:
        self.engine = engine
        self.served_model_name = served_model_name  # what a response naming none carries
        # vLLM's: only the served names (the model's path or name only when it is one of them)
        self.accepted_names = {served_model_name, *aliases}
        self.beams = BeamSearches(engine)

    @functools.cached_property
    def token_bytes(self) -> TokenBytes:
        """Each token's own bytes (logprobs' ``bytes``, completions' text offsets), read from
        the tokenizer's decoder once per serving object (chat's, completions')."""
        return TokenBytes(self.engine.tokenizer)

    def shown_cached_tokens(self, cached: int | None) -> int | None:
        """``cached`` prompt tokens as the usage shows them: only with
        --enable-prompt-tokens-details (``UsageInfo.of`` / ``usage_json`` leave out 0 too)."""
        return cached if self.options.enable_prompt_tokens_details else None

    def shown_model(self, model: str | None) -> str:
        """The model name a response carries: the served name the request asked for (vLLM's),
        the first served name when it named none."""
        return model if model and model in self.accepted_names else self.served_model_name

    def check_model(self, model: str | None) -> None:
        if model and model not in self.accepted_names:  # none or "": the served model
            raise NotFoundError(f"The model `{model}` does not exist.", param="model")

    async def start(
        self,
        request_id: str,
        prompt: str | dict[str, Any],
        params: SamplingParams,
        *,
        priority: int,
        prompt_param: str,
        max_tokens_param: str,
        logprobs_param: str = "logprobs",
        grammar_param: str = "structured_outputs",
        index: int = 0,
        sink: OutputSink | None = None,
        beam_width: int = 0,
        length_penalty: float = 1.0,
    ) -> StartedRequest:
        """Validate and enqueue one prompt; invalid input becomes a 400 naming the parameter.
        Its outputs go to ``sink`` (a streamed response), else to a new collector.
        ``grammar_param``: the request's field that carried its structured output.
        ``beam_width`` > 0: a beam search of that many beams (``use_beam_search``)."""
        if params.thinking_token_budget is not None and params.thinking_tags is None:
            params.thinking_tags = self.reasoning_tags  # this server's parser's, by id
        if beam_width:
            return await self._start_beam(request_id, prompt, params, beam_width,
                                          length_penalty, priority=priority,
                                          prompt_param=prompt_param,
                                          max_tokens_param=max_tokens_param, index=index,
                                          sink=sink)
        try:
            # The input processor works on a copy of ``params``: one object serves many prompts.
            collector = await self.engine.add_request(
                request_id, prompt, params, priority=priority, sink=sink, strict_max_tokens=True
            )
        except EngineDeadError as exc:
            raise engine_unavailable(exc) from exc
        except ValueError as exc:
            raise to_bad_request(exc, prompt_param, max_tokens_param, logprobs_param,
                                 grammar_param) from exc
        return StartedRequest(request_id, collector, index)

    async def _start_beam(
        self, request_id: str, prompt: str | dict[str, Any], params: SamplingParams,
        width: int, length_penalty: float, *, priority: int, prompt_param: str,
        max_tokens_param: str, index: int, sink: OutputSink | None,
    ) -> StartedRequest:
        self.beams.check_width(width)
        engine = self.engine
        try:
            # The engine core's checks too (the scheduling policy's priority, the KV cache):
            # the steps' requests would fail them inside the search.
            request, text = await engine.run_cpu(
                input_size(prompt), engine.process_input, request_id, prompt,
                self.beams.prepare(params, width), None, priority, True)
        except ValueError as exc:
            raise to_bad_request(exc, prompt_param, max_tokens_param) from exc
        cache_salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
        collector, task = self.beams.launch(
            request_id, request.prompt_token_ids, text, request.sampling_params, width,
            length_penalty, priority=priority, cache_salt=cache_salt, sink=sink)
        return StartedRequest(request_id, collector, index, search=task)

    def outputs(self, started: StartedRequest) -> AsyncGenerator[RequestOutput, None]:
        assert isinstance(started.collector, RequestOutputCollector)
        return self.engine.outputs(started.request_id, started.collector)

    async def final_output(self, started: StartedRequest,
                           grammar_param: str = "structured_outputs") -> RequestOutput:
        """The last output of a FINAL_ONLY request (aborted if the caller is cancelled).
        ``grammar_param``: the request's field that carried its structured output."""
        final: RequestOutput | None = None
        gen = self.outputs(started)
        try:
            async for out in gen:
                final = out
        except RequestFailedError as exc:
            raise request_failed(exc, grammar_param) from exc
        except EngineDeadError as exc:
            raise engine_unavailable(exc) from exc
        finally:
            await gen.aclose()
            if started.search is not None and not started.search.done():
                started.search.cancel()  # the response went away before the answer
        assert final is not None
        return final

    def abort(self, request_ids: list[str]) -> None:
        # Idempotent; used when a response ends before its requests did.
        self.engine.abort_nowait(self.beams.cancel(request_ids))


def to_bad_request(exc: ValueError, prompt_param: str, max_tokens_param: str,
                   logprobs_param: str = "logprobs",
                   grammar_param: str = "structured_outputs") -> BadRequestError:
    message = str(exc)
    param = getattr(exc, "parameter", None) or getattr(exc, "param", None)
    if param is None:
        if _CONTEXT_LENGTH.search(message):
            # "... (P in the messages, K in the completion)": the completion part is at fault
            # unless the prompt alone fills the context.
            param = max_tokens_param if "completion" in message else prompt_param
        elif (m := _LEADING_PARAM.match(message)) is not None:
            param = m.group(1)
    # Engine-side names -> the names of this endpoint's request body.
    if param in ("prompt", "prompt_token_ids"):
        param = prompt_param
    elif param == "max_tokens":
        param = max_tokens_param
    elif param == "logprobs":
        param = logprobs_param
    elif param == "structured_outputs":  # or response_format, or a forced tool choice
        param = grammar_param
        if message.startswith("structured_outputs"):
            message = grammar_param + message.removeprefix("structured_outputs")
    return BadRequestError(message, param)


def request_failed(exc: RequestFailedError, grammar_param: str = "structured_outputs"
                   ) -> APIError:
    """A request that failed in the engine: a 400 when the reason names one of its parameters
    (its own content was at fault, e.g. constraints that leave no token), else a 500. The
    engine's ``structured_outputs`` is named as the request gave it (``grammar_param``)."""
    m = _LEADING_PARAM.match(exc.reason)
    if m is None:
        return InternalServerError(str(exc))
    param, message = m.group(1), exc.reason
    if param == "structured_outputs":  # the message names the field as the request gave it
        param = grammar_param
        message = grammar_param + message.removeprefix("structured_outputs")
    return BadRequestError(message, param)


def engine_unavailable(exc: EngineDeadError) -> ServiceUnavailableError:
    return ServiceUnavailableError(f"The engine is not running: {exc}")


def stream_error_frame(exc: BaseException, grammar_param: str = "structured_outputs") -> str:
    """An SSE frame for an error raised after the stream started (``grammar_param``: as in
    ``request_failed``)."""
    return stream_error(exc, grammar_param).sse_frame()


def stream_error(exc: BaseException, grammar_param: str = "structured_outputs") -> APIError:
    """The error a stream reports for ``exc`` (an unexpected one is logged)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineDeadError):
        return engine_unavailable(exc)
    if isinstance(exc, RequestFailedError):
        return request_failed(exc, grammar_param)
    logger.exception("Error while streaming a response.", exc_info=exc)
    return InternalServerError(f"Internal error while streaming: {exc!r}")


def clamp_logprob(value: float) -> float:
    return LOGPROB_FLOOR if math.isinf(value) or math.isnan(value) else max(value, LOGPROB_FLOOR)


def prompt_logprobs_out(rows: EnginePromptLogprobs | None, num: int | None = None,
                        token_ids: Sequence[int] | None = None) -> PromptLogprobs | None:
    """vLLM's ``prompt_logprobs`` field from the engine's. ``num`` (with the prompt's
    ``token_ids``): the top entries asked for, where the engine computed more for an echo with
    more logprobs; each row keeps its prompt token too. -1 or None: every entry."""
    if rows is None:
        return None
    top = num if num is not None and num >= 0 and token_ids is not None else None

    def keep(i: int, t: int, lp: Logprob) -> bool:
        if top is None or lp.rank is None or lp.rank <= top:
            return True
        return token_ids is not None and t == token_ids[i]

    return [None if row is None else
            {t: PromptLogprob(logprob=clamp_logprob(lp.logprob), rank=lp.rank,
                              decoded_token=lp.decoded_token)
             for t, lp in row.items() if keep(i, t, lp)}
            for i, row in enumerate(rows)]


def token_text(token_id: int, lp: Logprob, as_ids: bool = False) -> str:
    """A logprobs entry's token as shown: its text, or ``token_id:N`` (vLLM's
    ``return_tokens_as_token_ids``, or where it has no text)."""
    if as_ids or lp.decoded_token is None:
        return f"token_id:{token_id}"
    return lp.decoded_token


def top_by_rank(row: dict[int, Logprob], n: int | None) -> list[tuple[int, Logprob]]:
    """The ``n`` most likely entries of one logprobs row, most likely first; -1: all of them
    (a row of the whole vocabulary); None: all of them in the row's order (the sampled token,
    then the tracked ``logprob_token_ids``)."""
    if n is None:
        return list(row.items())
    if n == 0:
        return []
    ranked = sorted(row.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
    return ranked if n < 0 else ranked[:n]


async def merge_async_iterators(
    *iterators: AsyncIterator[T],
) -> AsyncGenerator[tuple[int, T], None]:
    """Interleave several async iterators as items come: yields ``(index, item)``.

    Closing or cancelling the merged generator cancels every pump, which closes the sources.
    """
    if len(iterators) == 1:
        async for item in iterators[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, T] | tuple[int, BaseException] | None] = asyncio.Queue()
    _end = object()

    async def pump(i: int, it: AsyncIterator[T]) -> None:
        try:
            async for item in it:
                await queue.put((i, item))
        except Exception as exc:
            await queue.put((i, exc))
        finally:
            await queue.put((i, _end))  # type: ignore[arg-type]

    tasks = [asyncio.ensure_future(pump(i, it)) for i, it in enumerate(iterators)]
    remaining = len(tasks)
    try:
        while remaining:
            entry = await queue.get()
            assert entry is not None
            i, item = entry
            if item is _end:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item  # type: ignore[misc]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
