"""The scheduler's half that takes a step's output back (vLLM's
``Scheduler.update_from_output``): each request's sampled tokens appended up to its stop, the
finished ones freed, the ones the runner refused failed, and the ``EngineCoreOutputs`` for the
front end. A base class of ``Scheduler``, which holds the state it reads."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from cadence.core_types import EngineCoreOutput, EngineCoreOutputs, SchedulerStats
from cadence.runner_output import NO_TOKEN, ModelRunnerOutput
from cadence.scheduler.core_output import no_token_reason, request_output
from cadence.scheduler.output import SchedulerOutput
from cadence.scheduler.request import FinishReason, Request, RequestStatus
from cadence.scheduler.stop import append_until_stop

if TYPE_CHECKING:
    from collections.abc import Iterable

    from cadence.scheduler.kv_cache_manager import KVCacheManager
    from cadence.scheduler.request_queue import RequestQueue

__all__ = ["StepOutputHandling"]

_RUNNING = RequestStatus.RUNNING
_PREEMPTED = RequestStatus.PREEMPTED


class StepOutputHandling(ABC):
    """``update_from_output`` and what it needs of the scheduler's state."""

    requests: dict[str, Request]
    running: list[Request]
    waiting: RequestQueue
    max_model_len: int
    kv_cache_manager: KVCacheManager
    _scheduled_in: dict[int, dict[str, Request]]
    _finished_since_output: set[str]

    @abstractmethod
    def _free_request(self, request: Request) -> None:
        raise NotImplementedError

    @abstractmethod
    def make_stats(self) -> SchedulerStats:
        raise NotImplementedError

    @abstractmethod
    def finish_requests(self, request_ids: str | Iterable[str] | None,
                        finished_status: RequestStatus) -> None:
        raise NotImplementedError

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> EngineCoreOutputs:
        sampled = model_runner_output.sampled_token_ids
        index_of = model_runner_output.req_id_to_index
        logprobs = model_runner_output.logprobs
        prompt_logprobs = model_runner_output.prompt_logprobs
        requests = self.requests
        outputs: list[EngineCoreOutput] = []
        stopped_running: set[Request] = set()
        stopped_preempted: set[Request] = set()
        update = self._update_request_with_output

        scheduled = self._scheduled_in.pop(id(scheduler_output), None)
        failed = dict(model_runner_output.failed_requests)
        for req_id in scheduler_output.num_scheduled_tokens:
            request = requests.get(req_id)
            if request is None or request.status > _PREEMPTED:
                # Finished or aborted while this step was running: its tokens are dropped.
                continue
            if scheduled is not None and scheduled.get(req_id) is not request:
                continue  # the id was aborted and reused while this step ran
            row = index_of.get(req_id)
            if row is None:
                continue
            new_token_ids = sampled[row]
            if req_id in failed:
                continue  # refused by the runner: its row's token means nothing
            if new_token_ids and new_token_ids[0] == NO_TOKEN:
                failed[req_id] = no_token_reason(request)
                continue
            prompt_lps = prompt_logprobs.get(req_id) if prompt_logprobs else None
            if not new_token_ids:
                # A partial prefill chunk samples nothing; it may have scored prompt tokens.
                if prompt_lps is not None:
                    outputs.append(EngineCoreOutput(req_id, [], None, None, None,
                                                    request.num_cached_tokens, None, prompt_lps))
                continue

            status_before = request.status
            new_token_ids, stopped = update(request, new_token_ids)
            finish_reason = None
            if stopped:
                finish_reason = request.get_finished_reason()
                self._free_request(request)
                if status_before == _RUNNING:
                    stopped_running.add(request)
                else:
                    stopped_preempted.add(request)
            elif not new_token_ids:
                continue

            outputs.append(request_output(request, row, new_token_ids, finish_reason, logprobs,
                                          prompt_lps))

        if stopped_running:
            self.running = [r for r in self.running if r not in stopped_running]
        if stopped_preempted:
            self.waiting.remove_requests(stopped_preempted)
        if failed:
            outputs.extend(self._fail_requests(failed, scheduled))

        finished = self._finished_since_output
        self._finished_since_output = set()
        return EngineCoreOutputs(
            outputs=outputs, scheduler_stats=self.make_stats(), finished_requests=finished
        )

    def _fail_requests(self, failed: dict[str, str], scheduled: dict[str, Request] | None = None
                       ) -> list[EngineCoreOutput]:
        """Finish requests the runner refused with an error; the rest of the batch goes on.
        ``scheduled``: the step's requests, so that an id aborted and reused since is spared."""
        live = [r for r in failed if r in self.requests
                and (scheduled is None or scheduled.get(r, self.requests[r]) is self.requests[r])]
        for req_id in live:  # a refused request's step may not have filled what it registered
            self.kv_cache_manager.uncache_unwritten(self.requests[req_id], 0)
        self.finish_requests(live, RequestStatus.FINISHED_ERROR)
        return [
            EngineCoreOutput(r, [], finish_reason=FinishReason.ERROR, error=failed[r]) for r in live
        ]

    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int]
    ) -> tuple[list[int], bool]:
        """Append sampled tokens one by one, stopping at the first that ends the request."""
        return append_until_stop(request, new_token_ids, self.max_model_len)
