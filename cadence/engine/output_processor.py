"""Engine-core outputs -> ``RequestOutput``s: detokenize, stop strings, logprobs, metrics, n > 1
merging; the outputs go to each request's sink (``output_collector``) (vLLM v1 semantics).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from cadence.core_types import EngineCoreOutput, EngineCoreRequest, FinishReason
from cadence.engine.input_processor import InputValidationError
from cadence.engine.output_collector import OutputSink, RequestFailedError, RequestOutputCollector
from cadence.engine.parent_request import ParentRequest
from cadence.engine.request_state import RequestState, TokenTextCache
from cadence.metrics import FinishedRequestStats, IterationStats
from cadence.outputs import CompletionOutput, RequestOutput
from cadence.sampling_params import RequestOutputKind

__all__ = [
    "FinishedRequestStats",
    "IterationStats",
    "OutputProcessor",
    "OutputProcessorOutput",
    "OutputSink",
    "RequestFailedError",
    "RequestOutputCollector",
]

logger = logging.getLogger(__name__)


@dataclass
class OutputProcessorOutput:
    request_outputs: list[RequestOutput]
    # Requests finished here (stop strings) but still running in the engine core.
    reqs_to_abort: list[str]
    iteration_stats: IterationStats = field(default_factory=IterationStats)
    # Children of n > 1 requests to send to the engine core now (their prompt is cached).
    reqs_to_add: list[EngineCoreRequest] = field(default_factory=list)


class OutputProcessor:
    """Turns ``EngineCoreOutput``s into ``RequestOutput``s; one state per unfinished request."""

    def __init__(self, tokenizer: Any | None, stream_interval: int = 1) -> None:
        """``stream_interval``: the output interval of requests that set none."""
        self.tokenizer = tokenizer
        self.stream_interval = stream_interval
        self.request_states: dict[str, RequestState] = {}
        self.parents: dict[str, ParentRequest] = {}  # requests with n > 1, by their own id
        # Children ended because a sibling failed, still to abort in the engine core.
        self.failed_siblings: list[str] = []
        # Children to send to the core that no output of theirs released (a sibling failed).
        self.released: list[EngineCoreRequest] = []
        self._token_text = TokenTextCache(tokenizer) if tokenizer is not None else None

    def get_num_unfinished_requests(self) -> int:
        return len(self.request_states)

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    def unfinished_request_ids(self) -> list[str]:
        """The engine ids of every tracked request (an n > 1 request's children)."""
        return list(self.request_states)

    def is_request_active(self, request_id: str) -> bool:
        return request_id in self.request_states

    def add_request(
        self,
        request: EngineCoreRequest,
        prompt: str | None,
        queue: OutputSink | None = None,
    ) -> list[EngineCoreRequest]:
        """Track a new request (its metrics' arrival time is now, monotonic clock). Returns the
        engine requests to send to the core now: the request itself, or for n > 1 its first
        child (the others come back in ``reqs_to_add`` once its prompt is prefilled; all of
        them where none reads the prefix cache)."""
        request_id = request.request_id
        if request_id in self.request_states or request_id in self.parents:
            raise InputValidationError(f"Request id {request_id} already running.", "request_id")
        if request.sampling_params.n == 1:
            self._add_state(request, prompt, queue, None)
            return [request]
        parent = ParentRequest(request)
        taken = next((c for c in parent.child_ids if c in self.request_states), None)
        if taken is not None:  # a running request has one of the choices' engine ids
            raise InputValidationError(
                f"Request id {request_id} clashes with running request {taken} (the id of its "
                f"choice {parent.index_of(taken)}).", "request_id")
        self.parents[request_id] = parent
        for child in parent.children:
            self._add_state(child, prompt, queue, parent)
        return parent.sent_now()

    def _add_state(self, request: EngineCoreRequest, prompt: str | None,
                   queue: OutputSink | None, parent: ParentRequest | None) -> None:
        self.request_states[request.request_id] = RequestState(
            request, prompt, self.tokenizer, queue, time.monotonic(), self._token_text, parent,
            self.stream_interval,
        )

    def sink_of(self, request_id: str) -> OutputSink | None:
        """Where the tracked request (or n > 1 request) ``request_id`` sends its outputs."""
        parent = self.parents.get(request_id)
        ids = parent.child_ids if parent is not None else [request_id]
        for engine_id in ids:
            state = self.request_states.get(engine_id)
            if state is not None:
                return state.queue
        return None

    def engine_request_ids(self, request_ids: list[str]) -> list[str]:
        """``request_ids`` with each n > 1 request, or any one of its children, replaced by all
        its children's ids (a child's siblings may wait on its prefill to be sent: one child
        alone cannot end while they run on)."""
        out: list[str] = []
        for request_id in request_ids:
            parent = self.parents.get(request_id)
            if parent is None:
                state = self.request_states.get(request_id)
                parent = state.parent if state is not None else None
            out.extend(parent.child_ids if parent is not None else [request_id])
        return list(dict.fromkeys(out))

    def _emit(self, state: RequestState, out: RequestOutput,
              request_outputs: list[RequestOutput]) -> None:
        """Hand one output on: merged into its parent's for a child, to the request's sink (or
        the offline caller)."""
        parent = state.parent
        if parent is not None:
            merged = parent.merge(state.request_id, out)
            if parent.finished:
                self.parents.pop(parent.request_id, None)
            if merged is None:
                return
            out = merged
        if state.queue is not None:
            state.queue.put(out)
        else:
            request_outputs.append(out)

    def abort_requests(
        self, request_ids: list[str], stats: IterationStats | None = None
    ) -> list[str]:
        """Forget the given requests; returns those that were unfinished (to abort in the
        engine core). A request with a collector gets a final output, finish_reason "abort";
        with ``stats``, each one is also counted there as finished with reason "abort"."""
        aborted: list[str] = []
        now = time.monotonic()
        for request_id in self.engine_request_ids(request_ids):
            state = self.request_states.pop(request_id, None)
            if state is None:
                continue
            parent = state.parent
            if parent is None or parent.sent(request_id):
                aborted.append(request_id)  # only ids the core has can be drained
            if parent is not None:
                parent.forget_deferred({request_id})
                if not any(c in self.request_states for c in parent.child_ids):
                    self.parents.pop(parent.request_id, None)
            state.metrics.finished_time = now
            if stats is not None:
                stats.finished_requests.append(
                    self._finished_stats(state, FinishReason.ABORT, now)
                )
            if state.queue is not None:
                out = state.make_output([], 0, FinishReason.ABORT, None)
                if out is not None:
                    self._emit(state, out, [])
        return aborted

    def propagate_error(self, exc: Exception) -> None:
        """Hand ``exc`` to every waiting consumer (e.g. the engine died) and forget every
        request: none will get another output (an n > 1 request's consumer gets ``exc`` once
        per child, in its one collector, and every child ends)."""
        for state in self.request_states.values():
            if state.queue is not None:
                state.queue.put(exc)
        self.request_states.clear()
        self.parents.clear()
        self.failed_siblings.clear()
        self.released.clear()

    def process_outputs(
        self, outputs: list[EngineCoreOutput], engine_core_timestamp: float | None = None,
        stats: IterationStats | None = None,
    ) -> OutputProcessorOutput:
        """Detokenize and check stop strings, then put each request's output into its collector
        (or return it when it has none). Requests finished by a stop string go into
        ``reqs_to_abort`` so that the engine core frees them. ``stats``: the step's statistics
        to add to (one step's outputs handed over in several slices), else new ones."""
        now = time.monotonic() if engine_core_timestamp is None else engine_core_timestamp
        request_outputs: list[RequestOutput] = []
        reqs_to_abort: list[str] = []
        reqs_to_add: list[EngineCoreRequest] = []
        stats = IterationStats() if stats is None else stats
        for eco in outputs:
            state = self.request_states.get(eco.request_id)
            if state is None:
                continue  # already aborted or finished
            if eco.finish_reason == FinishReason.ERROR:
                reason = eco.error or "unknown error"
                self._fail(state, reason, now, request_outputs, stats)
                continue
            try:
                self._process_one(state, eco, now, request_outputs, reqs_to_abort, stats,
                                  reqs_to_add)
            except Exception as exc:
                # A fault in one request's output (a detokenizer error) fails that request only.
                logger.exception("Output processing failed for request %r.", eco.request_id)
                self._fail(state, f"output processing failed: {exc!r}", now, request_outputs, stats)
                if not eco.finished:
                    reqs_to_abort.append(eco.request_id)
        if self.failed_siblings:
            reqs_to_abort.extend(self.failed_siblings)
            self.failed_siblings = []
        if self.released:
            reqs_to_add.extend(self.released)
            self.released = []
        return OutputProcessorOutput(request_outputs, reqs_to_abort, stats, reqs_to_add)

    def _process_one(
        self,
        state: RequestState,
        eco: EngineCoreOutput,
        now: float,
        request_outputs: list[RequestOutput],
        reqs_to_abort: list[str],
        stats: IterationStats,
        reqs_to_add: list[EngineCoreRequest],
    ) -> None:
        new_ids = eco.new_token_ids
        finish_reason = eco.finish_reason
        stop_reason = eco.stop_reason
        state.num_cached_tokens = eco.num_cached_tokens
        if eco.timing is not None:
            state.metrics.queued_time, state.metrics.first_scheduled_time = eco.timing
        state.update_prompt_logprobs(eco)
        if new_ids:
            self._record_tokens(state, len(new_ids), now, stats)

        stop_string = state.detokenizer.update(
            new_ids, stop_terminated=finish_reason == FinishReason.STOP)
        if stop_string is not None:
            finish_reason = FinishReason.STOP
            stop_reason = stop_string
        num_new_logprobs = state.update_logprobs(eco)

        finished = finish_reason is not None
        if finished:
            state.metrics.finished_time = now
        if new_ids or finished:
            out = state.make_output(new_ids, num_new_logprobs, finish_reason, stop_reason)
            if out is not None:
                self._emit(state, out, request_outputs)
            if state.parent is not None:
                # The first child's prompt is prefilled: its siblings find it cached.
                reqs_to_add.extend(state.parent.take_deferred())
        if finished:
            assert finish_reason is not None
            del self.request_states[eco.request_id]
            if not eco.finished:
                reqs_to_abort.append(eco.request_id)
            stats.finished_requests.append(self._finished_stats(state, finish_reason, now))

    def _fail(
        self,
        state: RequestState,
        reason: str,
        now: float,
        request_outputs: list[RequestOutput],
        stats: IterationStats,
    ) -> None:
        """End one request with an error: its consumer gets ``RequestFailedError`` (offline
        callers an output with finish_reason "error")."""
        self.request_states.pop(state.request_id, None)
        state.metrics.finished_time = now
        parent = state.parent
        if state.queue is not None:
            if parent is None:
                state.queue.put(RequestFailedError(state.request_id, reason))
            else:
                # The consumer of an n > 1 request gets the error once, for the whole request:
                # the other children end here (the caller aborts them in the engine core), each
                # counted once as aborted (the last one counted records the parent's figures).
                state.queue.put(RequestFailedError(parent.request_id, reason))
                unsent = {c.request_id for c in parent.take_deferred()}
                self.parents.pop(parent.request_id, None)
                for child_id in parent.child_ids:
                    sibling = self.request_states.pop(child_id, None)
                    if sibling is not None:
                        if child_id not in unsent:
                            self.failed_siblings.append(child_id)
                        sibling.metrics.finished_time = now
                        stats.finished_requests.append(
                            self._finished_stats(sibling, FinishReason.ABORT, now))
        else:
            if parent is not None:
                # Offline, the other choices still run: the unsent ones go to the core now.
                self.released.extend(parent.take_deferred())
            # Offline callers see no exception: the reason goes to the log.
            logger.warning("Request %r failed: %s", state.request_id, reason)
            # No detokenizing here (it may be what failed): the text decoded so far, and the
            # tokens and logprobs so far (a delta output: what none has carried yet).
            delta = state.output_kind == RequestOutputKind.DELTA
            if delta:
                text, token_ids, logprobs = state.unsent()
            else:
                text, token_ids = state.detokenizer.output_text, list(
                    state.detokenizer.output_token_ids)
                logprobs = None if state.logprobs is None else state.logprobs[:]
            self._emit(
                state,
                RequestOutput(
                    request_id=state.request_id,
                    prompt=state.prompt,
                    prompt_token_ids=state.prompt_token_ids,
                    prompt_logprobs=None,
                    outputs=[
                        CompletionOutput(
                            0,
                            text,
                            token_ids,
                            cumulative_logprob=state.cumulative_logprob,
                            logprobs=logprobs,
                            finish_reason=str(FinishReason.ERROR),
                        )
                    ],
                    finished=True,
                    metrics=state.metrics.copy(),
                ),
                request_outputs,
            )
        stats.finished_requests.append(self._finished_stats(state, FinishReason.ERROR, now))

    @staticmethod
    def _finished_stats(
        state: RequestState, finish_reason: FinishReason, now: float
    ) -> FinishedRequestStats:
        m = state.metrics
        scheduled, first, last = m.first_scheduled_time, m.first_token_time, m.last_token_time
        n_param: int | None = 1
        most: int | None = m.num_generation_tokens
        if state.parent is not None:
            most = state.parent.observe_finished(m.num_generation_tokens)
            n_param = state.parent.n if most is not None else None
        tpot = m.mean_time_per_output_token
        return FinishedRequestStats(
            request_id=state.request_id,
            finish_reason=str(finish_reason),
            e2e_latency=now - m.arrival_time,
            num_prompt_tokens=len(state.prompt_token_ids),
            num_generation_tokens=m.num_generation_tokens,
            queued_time=(scheduled - m.queued_time
                         if scheduled is not None and m.queued_time is not None else None),
            prefill_time=first - scheduled if first is not None and scheduled is not None
            else None,
            decode_time=last - first if last is not None and first is not None else None,
            inference_time=last - scheduled if last is not None and scheduled is not None
            else None,
            # vLLM observes 0 for a request of at most one token.
            mean_time_per_output_token=0.0 if tpot is None else tpot,
            max_tokens_param=state.max_tokens_param,
            n_param=n_param,
            max_num_generation_tokens=most,
        )

    @staticmethod
    def _record_tokens(state: RequestState, n: int, now: float, stats: IterationStats) -> None:
        m = state.metrics
        if m.first_token_time is None:
            m.first_token_time = now
            stats.time_to_first_tokens.append(now - m.arrival_time)
            stats.num_prompt_tokens += len(state.prompt_token_ids)
        elif m.last_token_time is not None:
            stats.inter_token_latencies.append(now - m.last_token_time)
        m.last_token_time = now
        m.num_generation_tokens += n
        stats.num_generation_tokens += n
