"""AsyncLLM: the asyncio front end of the engine (vLLM v1 ``AsyncLLM``).

``generate()`` validates and tokenizes a prompt in a worker thread (never on the event loop),
registers a per-request ``RequestOutputCollector`` with the ``OutputProcessor`` and hands the
request to the engine core thread. One background output-handler task moves engine outputs
through the output processor (detokenization, stop strings) into the collectors, and aborts in
the core the requests that a stop string finished.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from cadence.config import EngineConfig
from cadence.core_types import EngineCoreRequest, SchedulerStats
from cadence.engine.async_beam_search import search_prompt
from cadence.engine.core_client import EngineCoreClient, EngineDeadError
from cadence.engine.core_proc import EngineCoreLike
from cadence.engine.core_utilities import CoreUtilities
from cadence.engine.engine_args import EngineArgs
from cadence.engine.frontend import connect_core, load_frontend
from cadence.engine.input_worker import InputWorker, input_size, params_size
from cadence.engine.output_processor import (
    IterationStats,
    OutputProcessor,
    OutputSink,
    RequestOutputCollector,
)
from cadence.engine.output_pump import OutputPump
from cadence.engine.parent_request import child_request_id
from cadence.engine.request_ledger import RequestLedger
from cadence.engine.request_logger import RequestLogger
from cadence.engine.tokenization_kwargs import TokenizationKwargs
from cadence.inputs import check_data_parallel_rank, given_prompt_text, refuse_lora
from cadence.metrics import StatLogger
from cadence.sampling_params import BeamSearchParams, SamplingParams

if TYPE_CHECKING:
    from cadence.engine.core_process import ProcessEngineCoreClient
    from cadence.outputs import RequestOutput

logger = logging.getLogger(__name__)

__all__ = ["AsyncLLM", "EngineDeadError", "PromptType"]

PromptType = str | dict[str, Any]

T = TypeVar("T")


class AsyncLLM(CoreUtilities):
    """Serve requests from one engine core thread to many asyncio consumers."""

    def __init__(
        self,
        args: EngineArgs | None = None,
        *,
        log_requests: bool = False,
        core_factory: Callable[[], EngineCoreLike] | None = None,
        core_client: ProcessEngineCoreClient | None = None,
        max_log_len: int | None = None,
    ) -> None:
        """Start the engine core thread (built there from ``args``, or by ``core_factory``),
        or its process (``args.engine_process``); or use ``core_client``, a client of an
        engine-core process that a launcher started (one of several front ends).
        ``log_requests``: log each request's prompt and parameters when it arrives and its end
        (the prompt's characters and token ids cut to ``max_log_len``, vLLM's)."""
        self.args = args if args is not None else EngineArgs()
        self.log_requests = log_requests or getattr(self.args, "enable_log_requests", False)
        self.max_log_len = max_log_len
        self._log = RequestLogger(logger, max_log_len) if self.log_requests else None
        client, core = connect_core(self.args, core_factory, core_client)
        self.engine_core: EngineCoreClient = client
        self._validate_in_core: Callable[[EngineCoreRequest], None] | None = getattr(
            core, "validate_request", None
        )
        try:
            frontend = load_frontend(core)
        except BaseException:
            client.shutdown()
            raise
        self.tokenizer = frontend.tokenizer
        self.input_processor = frontend.input_processor
        self.model_name: str = frontend.model_name
        self.max_model_len: int = frontend.max_model_len
        # Default sampling fields of requests that leave them unset (the generation config).
        self.generation_defaults: dict[str, Any] = dict(core.spec.generation_defaults)
        self.config: EngineConfig = core.config
        self.num_kv_blocks: int = core.num_kv_blocks
        self.block_size: int = core.block_size
        self.output_processor = OutputProcessor(self.tokenizer,
                                                core.config.scheduler.stream_interval)
        # Tokenization, chat templates and request validation: off the event loop but for
        # small inputs.
        self._input_worker = InputWorker(lambda: self.errored, EngineDeadError)

        self._ledger = RequestLedger()  # ids being prepared, and ended ids still draining

        self._pump = OutputPump(client, self.output_processor, self._ledger,
                                lambda: self.errored)
        self.output_handler: asyncio.Task[None] | None = None
        self._handler_loop: asyncio.AbstractEventLoop | None = None
        # Set when the output handler fails: it may still be stopping the core (which runs on
        # meanwhile), but nothing will collect outputs any more.
        self._handler_failed = False
        self._shut_down = False  # by shutdown(), or by the event loop it ran in closing
        self._shut_down_by = "shutdown()"
        # NOTE: an engine never shut down is stopped at interpreter exit: a core thread still
        # running torch code while the interpreter tears down can abort the process.
        self._finalizer = weakref.finalize(self, client.shutdown)
        try:
            asyncio.get_running_loop()
            self._run_output_handler()
        except RuntimeError:  # built outside an event loop: start on the first request
            pass

    @classmethod
    def from_engine_args(cls, args: EngineArgs, *, log_requests: bool = False,
                         enable_log_requests: bool = False) -> AsyncLLM:
        """``enable_log_requests``: vLLM's name for ``log_requests``."""
        return cls(args, log_requests=log_requests or enable_log_requests)

    # -- state -------------------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        if self._handler_failed:
            return False
        return self.output_handler is None or not self.output_handler.done()

    @property
    def errored(self) -> bool:
        return self.engine_core.errored or not self.is_running

    async def check_health(self) -> None:
        if self.errored:
            raise self._dead_error()

    def _dead_error(self) -> EngineDeadError:
        if self._shut_down:
            return EngineDeadError(f"The engine was shut down (by {self._shut_down_by}).")
        return EngineDeadError()

    def has_unfinished_requests(self) -> bool:
        """Some request of this front end has not finished (its outputs bring fresh scheduler
        stats with every engine step)."""
        return self.output_processor.has_unfinished_requests()

    def seconds_without_progress(self) -> float:
        """How long unfinished requests have gone without a completed engine step (0 when no
        request is unfinished): what a stall watchdog compares with its timeout."""
        if not self.output_processor.has_unfinished_requests():
            return 0.0
        return max(0.0, time.monotonic() - self.engine_core.last_progress_time)

    async def run_in_executor(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run per-request CPU work (tokenizing, rendering templates) in the input thread."""
        return await self._input_worker.run_in_thread(fn, *args, **kwargs)

    async def run_cpu(self, size: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``run_in_executor``, or here at once for an input of ``size`` at most
        ``INLINE_INPUT_LIMIT`` while the input thread is idle (see :mod:`.input_worker`)."""
        return await self._input_worker.run(size, fn, *args, **kwargs)

    def add_stat_logger(self, stat_logger: StatLogger) -> None:
        self._pump.stat_loggers.append(stat_logger)

    @property
    def stat_loggers(self) -> list[StatLogger]:
        return self._pump.stat_loggers

    @property
    def last_scheduler_stats(self) -> SchedulerStats | None:
        """The latest scheduler statistics: of the last engine step, or a fresh query."""
        return self._pump.last_scheduler_stats

    # -- requests ----------------------------------------------------------------------------
    async def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: float | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Any = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        prompt_text: str | None = None,
        *,
        sink: OutputSink | None = None,
        strict_max_tokens: bool = False,
    ) -> OutputSink:
        """Validate, tokenize and enqueue one request (vLLM's arguments, in its order); return
        where its outputs go: ``sink`` if given (e.g. a server's SSE frame stream), else a new
        ``RequestOutputCollector``. ``strict_max_tokens``: a ``max_tokens`` past the context is
        an error (the OpenAI server's rule) instead of capped at it (the engine's, as vLLM's).
        ``tokenization_kwargs``: as ``LLM.generate``'s; ``prompt_text``: the text of a token-id
        prompt, for its outputs' ``prompt`` (vLLM's)."""
        if self.errored:
            raise self._dead_error()
        self._check_loop()
        refuse_lora(lora_request)
        check_data_parallel_rank(data_parallel_rank)
        sampling_params = params
        tokenization = None
        if tokenization_kwargs is not None:
            tokenization = TokenizationKwargs.parse(tokenization_kwargs)
            prompt = tokenization.prompt(prompt)
            sampling_params = tokenization.params(sampling_params)
        # An abort that arrives while the request is being prepared is applied once it is in.
        self._ledger.begin_preparing(request_id)
        try:
            collector = await self._add_prepared(request_id, prompt, sampling_params,
                                                 arrival_time, priority, sink, strict_max_tokens,
                                                 tokenization, prompt_text)
        finally:
            aborted = self._ledger.end_preparing(request_id)
        if aborted:
            self.abort_nowait([request_id])
        return collector

    async def _add_prepared(
        self,
        request_id: str,
        prompt: PromptType,
        sampling_params: SamplingParams,
        arrival_time: float | None,
        priority: int,
        sink: OutputSink | None,
        strict_max_tokens: bool,
        tokenization: TokenizationKwargs | None = None,
        given_text: str | None = None,
    ) -> OutputSink:
        try:
            request, prompt_text = await self.run_cpu(
                input_size(prompt) + params_size(sampling_params),
                self.process_input, request_id, prompt, sampling_params, arrival_time,
                priority, strict_max_tokens,
            )  # fmt: skip
        except ValueError as e:
            if self._log is not None:
                self._log.refused(request_id, prompt, sampling_params, e)
            raise
        if tokenization is not None:  # its max_length bounds the tokenized prompt
            tokenization.check_length(len(request.prompt_token_ids))
        prompt_text = given_prompt_text(prompt_text, given_text)
        if self.errored:
            raise self._dead_error()
        n = request.sampling_params.n
        engine_ids = [request_id] if n == 1 else [child_request_id(i, request_id)
                                                  for i in range(n)]
        for engine_id in engine_ids:
            while (draining := self._ledger.draining_event(engine_id)) is not None:
                await draining.wait()
                if self.errored:
                    raise self._dead_error()
        self._run_output_handler()
        collector = (
            sink
            if sink is not None
            else RequestOutputCollector(request.sampling_params.output_kind, request_id)
        )
        to_send = self.output_processor.add_request(request, prompt_text, collector)
        try:
            for engine_request in to_send:
                self.engine_core.add_request(engine_request)
        except EngineDeadError:
            self.output_processor.abort_requests([request_id])
            raise
        if self._log is not None:
            self._log.received(request_id, prompt_text, request.sampling_params,
                               request.prompt_token_ids)
        return collector

    def process_input(
        self,
        request_id: str,
        prompt: PromptType,
        sampling_params: SamplingParams,
        arrival_time: float | None,
        priority: int,
        strict_max_tokens: bool,
    ) -> tuple[EngineCoreRequest, str | None]:
        """Validate and tokenize one request as ``add_request`` does (the engine core's own
        checks included), enqueueing nothing: ValueError names what is wrong."""
        request, prompt_text = self.input_processor.process(
            request_id, prompt, sampling_params, arrival_time=arrival_time, priority=priority,
            strict_max_tokens=strict_max_tokens,
        )
        if self._validate_in_core is not None:
            self._validate_in_core(request)  # whole-KV-cache fit (read-only)
        return request, prompt_text

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        prompt_text: str | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Any = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Yield the outputs of one request until it finishes.

        Invalid input raises ``ValueError`` before anything is scheduled. If the consumer
        cancels or closes the generator, the request is aborted in the engine.
        ``data_parallel_rank``: vLLM's; one engine serves here, rank 0 (or None).
        ``tokenization_kwargs``: as ``LLM.generate``'s; ``prompt_text``, ``trace_headers``: as
        ``add_request``'s (vLLM's).
        """
        collector = await self.add_request(request_id, prompt, sampling_params, priority=priority,
                                           lora_request=lora_request,
                                           data_parallel_rank=data_parallel_rank,
                                           tokenization_kwargs=tokenization_kwargs,
                                           trace_headers=trace_headers, prompt_text=prompt_text)
        outputs = self.outputs(request_id, collector)
        try:
            async for out in outputs:
                yield out
        finally:
            await outputs.aclose()

    async def beam_search(self, prompt: PromptType, request_id: str, params: BeamSearchParams,
                          lora_request: Any = None) -> AsyncGenerator[RequestOutput, None]:
        """vLLM's ``EngineClient.beam_search``: yields the search's one finished output, the
        ``params.beam_width`` best sequences, best first (``async_beam_search``)."""
        refuse_lora(lora_request)
        yield await search_prompt(self, prompt, request_id, params)

    async def outputs(
        self, request_id: str, collector: RequestOutputCollector
    ) -> AsyncGenerator[RequestOutput, None]:
        """Yield what ``collector`` (from ``add_request``) receives until the request finishes;
        abort the request if the consumer cancels or closes this generator first."""
        try:
            finished = False
            while not finished:
                # Take what is there without a task switch; wait only when the slot is empty.
                out = collector.get_nowait() or await collector.get()
                finished = out.finished
                if finished and self._log is not None:
                    self._log.finished(request_id, out)
                yield out
        except (asyncio.CancelledError, GeneratorExit):
            if self._still_names(request_id, collector):
                self.abort_nowait([request_id], preparing_too=False)
                if self._log is not None:
                    self._log.left(request_id)
            raise

    def _still_names(self, request_id: str, collector: OutputSink) -> bool:
        """Whether ``request_id`` still names the request that sends to ``collector``: a
        generator closed late (dropped, then finalized) after its request ended must not abort
        a newer request that reuses the id (vLLM's internal ids keep them apart)."""
        sink = self.output_processor.sink_of(request_id)
        if sink is not None:
            return sink is collector
        # Untracked: ours finished (the core may still hold it a moment), unless a newer
        # request under the id is being prepared.
        return request_id not in self._ledger.preparing

    async def get_tokenizer(self) -> Any:
        """The tokenizer (vLLM's coroutine; also the ``tokenizer`` attribute)."""
        return self.tokenizer

    async def abort(self, request_id: str | Iterable[str], internal: bool = False) -> None:
        """Abort requests: each one's consumer gets a final ``finish_reason="abort"`` output.
        ``internal`` (vLLM's) changes nothing here: request ids are the engine's own."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self.abort_nowait(ids)
        if self._log is not None:
            self._log.aborted(ids)

    def abort_nowait(self, request_ids: list[str], *, preparing_too: bool = True) -> None:
        """``abort`` without awaiting: usable while an async generator is being closed.
        ``preparing_too``: a request under one of the ids that is still being prepared is
        aborted once it is in (an abort by id); False where the abort is of one request only
        (its consumer left), which a newer request reusing the id must outlive."""
        # Ids the output processor no longer tracks (finished by a stop string a moment ago)
        # may still be in the core: abort every given id there; the core ignores unknown ones.
        stats = IterationStats()
        if preparing_too:
            self._ledger.note_aborts(request_ids)
        engine_ids = self.output_processor.engine_request_ids(list(request_ids))
        self._pump.start_draining(self.output_processor.abort_requests(engine_ids, stats))
        self.engine_core.abort_requests(engine_ids)
        if stats.finished_requests:
            # Counted as finished, reason "abort" (docs/serving.md).
            self._pump.record_stats(None, stats)

    # -- output handler ----------------------------------------------------------------------
    def start_output_handler(self) -> None:
        """Start collecting the core's outputs now (in the running event loop), not at the
        first request: a server's front end 0 records the engine-wide metrics from every
        step's outputs, also when no request of its own ever comes."""
        self._run_output_handler()

    def _check_loop(self) -> None:
        """Outputs are collected in the event loop the engine first ran in: a request from
        another loop gets them only while that one runs (in another thread). Where it does not
        run, the request would wait for ever: refused instead."""
        loop = self._handler_loop
        if loop is None or loop is asyncio.get_running_loop() or loop.is_running():
            return
        raise RuntimeError(
            "this AsyncLLM collects its outputs in the event loop it first ran in, which is "
            + ("closed" if loop.is_closed() else "not running")
            + ": make requests in that loop, or make the AsyncLLM in this one")

    def _run_output_handler(self) -> None:
        if self.output_handler is not None:
            return
        self._handler_loop = asyncio.get_running_loop()
        self.output_handler = asyncio.create_task(self._output_handler(), name="output-handler")

    async def _output_handler(self) -> None:
        try:
            await self._pump.run()
        except asyncio.CancelledError:
            # shutdown(), or the event loop closing: no loop collects outputs any more, so the
            # core stops too (its thread would otherwise run on for no one).
            if not self._shut_down:
                self._shut_down_by = ("its event loop closing: an AsyncLLM serves the event "
                                      "loop it first ran in")
            self._handler_failed = self._shut_down = True
            self.output_processor.propagate_error(self._dead_error())
            self._finalizer()
            self._pump.record_engine_gone()
            raise
        except Exception as exc:
            self._handler_failed = True
            if not isinstance(exc, EngineDeadError):
                logger.exception("AsyncLLM output handler failed.")
            self.output_processor.propagate_error(
                exc if isinstance(exc, EngineDeadError) else EngineDeadError(repr(exc))
            )
            self._pump.record_engine_gone()
            if not isinstance(exc, EngineDeadError):
                # Nobody collects the core's outputs any more: stop it rather than let it run
                # its requests for no one.
                await asyncio.to_thread(self.engine_core.shutdown)

    # -- utilities ---------------------------------------------------------------------------
    async def get_scheduler_stats(self) -> SchedulerStats:
        """Fresh scheduler statistics, taken between two engine steps."""
        stats: SchedulerStats = await self.engine_core.call_utility_async("make_stats")
        self._pump.last_scheduler_stats = stats
        return stats

    async def do_log_stats(self) -> None:
        """Push fresh scheduler statistics to every stat logger (e.g. before a scrape)."""
        self._pump.record_stats(await self.get_scheduler_stats(), None)

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the engine core thread; consumers still waiting get ``EngineDeadError``."""
        self._shut_down = True
        self._finalizer.detach()
        self.engine_core.shutdown(timeout)
        self._input_worker.shutdown()
        handler = self.output_handler
        if handler is not None and not handler.done():
            loop = self._handler_loop
            if loop is not None and not loop.is_closed():
                try:
                    running = asyncio.get_running_loop()
                except RuntimeError:
                    running = None
                if running is loop:
                    handler.cancel()
                else:
                    loop.call_soon_threadsafe(handler.cancel)

