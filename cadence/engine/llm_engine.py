"""LLMEngine: the synchronous step loop under ``LLM`` (vLLM's ``LLMEngine``). Add requests, then
call ``step()`` while ``has_unfinished_requests()``: each step schedules and runs one batch and
returns the outputs it produced (every running request's, or only finished ones, as each
request's ``output_kind`` asks)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from cadence.config import EngineConfig
from cadence.core_types import EngineCoreRequest
from cadence.engine.core import EngineCore
from cadence.engine.engine_args import EngineArgs
from cadence.engine.frontend import load_frontend
from cadence.engine.output_processor import IterationStats, OutputProcessor
from cadence.engine.tokenization_kwargs import TokenizationKwargs
from cadence.inputs import given_prompt_text, refuse_lora
from cadence.metrics import PrometheusStatLogger, cache_config_info
from cadence.metrics_reader import Metric, metrics_snapshot
from cadence.outputs import RequestOutput
from cadence.sampling_params import SamplingParams
from cadence.worker.worker_rpc import ApplyModel, check_timeout

logger = logging.getLogger(__name__)


class LLMEngine:
    """One engine core stepped by its caller, with the tokenizer and output processing around
    it: requests in as prompts, ``RequestOutput``s out."""

    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        self.engine_core = EngineCore(args)
        self.frontend = load_frontend(self.engine_core)
        self.output_processor = OutputProcessor(
            self.frontend.tokenizer, self.engine_core.config.scheduler.stream_interval)
        self._closed = False
        # vLLM's: statistics kept where disable_log_stats is False (get_metrics reads them).
        self.stat_logger = None if args.disable_log_stats else self._make_stat_logger()

    def _make_stat_logger(self) -> PrometheusStatLogger:
        core, args = self.engine_core, self.args
        names = args.served_model_name
        name = names if isinstance(names, str) else (names or [self.frontend.model_name])[0]
        return PrometheusStatLogger(
            name, max_model_len=core.config.scheduler.max_model_len,
            cache_info=cache_config_info(args, core.block_size, core.num_kv_blocks))

    def get_metrics(self) -> list[Metric]:
        """vLLM's: a snapshot of this engine's statistics (``metrics_reader``; the names are the
        server's, ``cadence:`` where vLLM's are ``vllm:``). Needs ``disable_log_stats=False``."""
        if self.stat_logger is None:
            raise RuntimeError("get_metrics: statistics are off; create the engine with "
                               "disable_log_stats=False.")
        return metrics_snapshot(self.stat_logger.registry)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, usage_context: Any = None,
                         stat_loggers: Any = None, enable_multiprocessing: bool = False,
                         ) -> LLMEngine:
        """vLLM's constructor (its other arguments are accepted and change nothing here: the
        core runs in this process and its statistics come from ``make_stats``)."""
        return cls(engine_args)

    @property
    def config(self) -> EngineConfig:
        return self.engine_core.config

    @property
    def tokenizer(self) -> Any:
        return self.frontend.tokenizer

    def get_tokenizer(self) -> Any:
        return self.frontend.tokenizer

    def add_request(
        self,
        request_id: str,
        prompt: Any,
        params: SamplingParams,
        arrival_time: float | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Any = None,
        priority: int = 0,
        prompt_text: str | None = None,
    ) -> str:
        """Validate and tokenize one request and hand it to the core; returns its id. Bad input
        raises ValueError (naming the field) before anything is queued; an id that is not a
        string, TypeError (vLLM's). ``prompt_text``: the text of a token-id prompt, for its
        outputs' ``prompt``."""
        self._check_open()
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a string, got {type(request_id).__name__}.")
        refuse_lora(lora_request)
        tokenization = TokenizationKwargs.parse(tokenization_kwargs)
        request, text = self.prepare_request(request_id, prompt, params, tokenization,
                                             arrival_time, priority)
        self.submit(request, given_prompt_text(text, prompt_text))
        return request_id

    def prepare_request(self, request_id: str, prompt: Any, params: SamplingParams,
                        tokenization: TokenizationKwargs, arrival_time: float | None = None,
                        priority: int = 0) -> tuple[EngineCoreRequest, str | None]:
        """One request validated and tokenized (``tokenization`` applied) as the core will take
        it, and its prompt text; nothing is queued (ValueError naming the field)."""
        request, text = self.frontend.input_processor.process(
            request_id, tokenization.prompt(prompt), tokenization.params(params), arrival_time,
            priority)
        tokenization.check_length(len(request.prompt_token_ids))
        self.engine_core.validate_request(request)
        return request, text

    def submit(self, request: EngineCoreRequest, text: str | None) -> None:
        """Hand a prepared request to the core (an n > 1 request: the children sent now)."""
        for engine_request in self.output_processor.add_request(request, text):
            self.engine_core.add_request(engine_request)

    def step(self) -> list[RequestOutput]:
        """Run one engine step; the outputs it produced (none while a step is in flight under
        async scheduling). An exception out of the step (a Ctrl-C among them) aborts every
        unfinished request before it propagates: the step's progress is lost with it, and a
        request left half-stepped would never be scheduled again."""
        self._check_open()
        try:
            outputs, _ = self.engine_core.step_fn()
        except BaseException as exc:
            self.abort_request(self.output_processor.unfinished_request_ids())
            if isinstance(exc, SystemError) and isinstance(exc.__cause__, KeyboardInterrupt):
                # A Ctrl-C inside a compiled (numba) host pass reaches Python as a SystemError
                # caused by it; the caller's `except KeyboardInterrupt` must see the Ctrl-C.
                raise exc.__cause__ from None
            raise
        stats = None if self.stat_logger is None else IterationStats()
        if outputs is None or not outputs.outputs:
            if outputs is not None and stats is not None:
                self.stat_logger.record(outputs.scheduler_stats, None)
            return []
        processed = self.output_processor.process_outputs(outputs.outputs, outputs.timestamp,
                                                          stats)
        if stats is not None:
            self.stat_logger.record(outputs.scheduler_stats, stats)
        if processed.reqs_to_abort:  # ended by a stop string, which only the text shows
            self.engine_core.abort_requests(processed.reqs_to_abort)
        for child in processed.reqs_to_add:  # n > 1: siblings sent once the prompt is cached
            self.engine_core.add_request(child)
        return processed.request_outputs

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.output_processor.get_num_unfinished_requests()

    def abort_request(self, request_ids: str | Iterable[str], internal: bool = False) -> None:
        """Stop the given requests (unknown or finished ids are ignored); no output follows."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        # Every engine id of an n > 1 request: a child not yet sent has nothing to drain.
        engine_ids = self.output_processor.engine_request_ids(ids)
        self.output_processor.abort_requests(ids)
        self.engine_core.abort_requests(engine_ids)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return self.engine_core.reset_prefix_cache(reset_running_requests)

    def start_profile(self, profile_prefix: str | None = None) -> None:
        """Start the torch profiler around what the engine runs next (vLLM's; traces go to
        ``CADENCE_TORCH_PROFILER_DIR``, cadence/torch_profiler.py)."""
        self._check_open()
        self.engine_core.profile(True, profile_prefix)

    def stop_profile(self) -> str | None:
        """Stop the profiler; the path of the trace it wrote."""
        self._check_open()
        return self.engine_core.profile(False)

    def collective_rpc(self, method: str | Callable[..., Any], timeout: float | None = None,
                       args: Sequence[Any] = (),
                       kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """vLLM's: ``method`` (a model runner method's name, or a function called with the
        runner first) on every worker between two steps; their results in rank order
        (``worker/worker_rpc.py``). The call runs in this thread: as in vLLM's single-process
        executor, ``timeout`` (checked) bounds nothing here."""
        self._check_open()
        check_timeout(timeout)
        return self.engine_core.collective_rpc(method, args, kwargs)

    def apply_model(self, func: Callable[[Any], Any]) -> list[Any]:
        """vLLM's: ``func(model)`` on every worker; its results in rank order."""
        return self.collective_rpc(ApplyModel(func))

    def do_log_stats(self) -> None:
        """Log the scheduler's figures now (vLLM's)."""
        stats = self.engine_core.make_stats()
        logger.info("Running: %d reqs, waiting: %d reqs, KV cache usage: %.1f%%, prefix cache "
                    "hits: %d of %d tokens, preemptions: %d", stats.num_running_reqs,
                    stats.num_waiting_reqs, 100 * stats.kv_cache_usage, stats.prefix_cache_hits,
                    stats.prefix_cache_queries, stats.num_preemptions)

    def shutdown(self) -> None:
        """Free the engine's device state; no request is taken after it."""
        self._closed = True
        self.engine_core.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this engine has been shut down; create a new one to generate.")
