"""The scheduler: which requests run this step, with how many tokens (vLLM v1 ``Scheduler``).

There is no prefill or decode phase: every request has ``num_computed_tokens`` and a number of
known tokens, and each step gives requests token budget so the first catches up with the second.
That one rule covers chunked prefill, prefix-cache hits, resumption after preemption and decode.
``num_computed_tokens`` advances when a step is scheduled, not when its output arrives, so a
request can be scheduled again before the previous step's output is back (async scheduling).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from cadence.config import CacheConfig, SchedulerConfig
from cadence.core_types import SchedulerStats
from cadence.scheduler.block_pool import KVCacheBlock
from cadence.scheduler.kv_cache_manager import KVCacheManager
from cadence.scheduler.output import SchedulerOutput, scheduled_request_data
from cadence.scheduler.request import Request, RequestStatus
from cadence.scheduler.request_queue import create_request_queue
from cadence.scheduler.step_output import StepOutputHandling

_RUNNING = RequestStatus.RUNNING
_PREEMPTED = RequestStatus.PREEMPTED
_NO_NEW_BLOCKS: list[KVCacheBlock] = []  # shared, never mutated


def _victim_key(request: Request) -> tuple[int, float, str]:
    # NOTE: the waiting queue's order (Request.__lt__), ties included: the request it would
    # admit first is never preempted for one after it. Ties broken by the running list's order
    # instead (an n > 1 request's children share an arrival time) let two requests preempt
    # each other for ever, each losing its progress.
    return request.priority, request.arrival_time, request.request_id


class Scheduler(StepOutputHandling):
    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        num_kv_blocks: int,
        defer_prefix_caching: bool = False,
        rope_switch_len: int = 0,
    ) -> None:
        """``defer_prefix_caching``: a step's full blocks enter the prefix cache at
        ``flush_deferred_caching`` (the engine calls it once the step has launched) or at the
        next lookup or free, whichever comes first; no request hits differently.

        ``rope_switch_len`` L > 0 (longrope past its original length, ``model.rope``): a
        sequence of more than L tokens has every key rotated with the long factors, one of at
        most L tokens with the short ones (transformers' Phi-3). A request takes the long
        factors (``Request.rope_long``) when it is admitted with more than L tokens; one that
        grows past L while decoding is preempted there and recomputed with them, as
        transformers recomputes its cache at that step."""
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.max_num_running_reqs = scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = scheduler_config.max_num_batched_tokens
        self.max_model_len = scheduler_config.max_model_len
        self.enable_chunked_prefill = scheduler_config.enable_chunked_prefill
        self.long_prefill_token_threshold = scheduler_config.long_prefill_token_threshold
        self.policy = scheduler_config.policy
        self.block_size = cache_config.block_size
        self.rope_switch_len = rope_switch_len
        self.kv_cache_manager = KVCacheManager(
            num_blocks=num_kv_blocks,
            block_size=cache_config.block_size,
            enable_caching=cache_config.enable_prefix_caching,
            max_model_len=scheduler_config.max_model_len,
            defer_caching=defer_prefix_caching,
        )

        self.requests: dict[str, Request] = {}
        # id(SchedulerOutput) -> {req_id: Request} of steps not yet consumed (update_from_output).
        self._scheduled_in: dict[int, dict[str, Request]] = {}
        self.waiting = create_request_queue(self.policy)
        self.running: list[Request] = []
        # Finished or aborted since the previous schedule(): the runner drops their state.
        self.finished_req_ids: set[str] = set()
        # Finished or aborted since the previous update_from_output(): for the front end.
        self._finished_since_output: set[str] = set()
        # Preempted outside schedule() (forced prefix-cache reset): reported by the next step.
        self._preempted_outside_step: set[str] = set()
        self.num_preemptions = 0

    # Requests --------------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already scheduled.")
        if request.num_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"the prompt has {request.num_prompt_tokens} tokens."
            )
        if request.max_tokens is None:
            request.max_tokens = self.max_model_len - request.num_prompt_tokens
        if self._past_rope_switch(request, request.num_tokens):
            request.take_long_rope()
        self.waiting.add_request(request)
        self.requests[request.request_id] = request

    def _past_rope_switch(self, request: Request, num_tokens: int) -> bool:
        """Whether ``num_tokens`` of ``request`` reach past longrope's switch while its keys
        still take the short factors."""
        return 0 < self.rope_switch_len < num_tokens and not request.rope_long

    def finish_requests(
        self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus
    ) -> None:
        """Finish requests from outside (abort); None: every request. Unknown or already
        finished ids are ignored."""
        if not RequestStatus.is_finished(finished_status):
            raise ValueError(f"{finished_status!r} is not a finished status.")
        if request_ids is None:
            request_ids = list(self.requests)
        elif isinstance(request_ids, str):
            request_ids = (request_ids,)
        to_finish: list[Request] = []
        running_to_remove: set[Request] = set()
        waiting_to_remove: list[Request] = []
        for req_id in dict.fromkeys(request_ids):
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            to_finish.append(request)
            if request.status == _RUNNING:
                running_to_remove.add(request)
            else:
                waiting_to_remove.append(request)
        if running_to_remove:
            self.running = [r for r in self.running if r not in running_to_remove]
        if waiting_to_remove:
            self.waiting.remove_requests(waiting_to_remove)
        for request in to_finish:
            request.status = finished_status
            self._free_request(request)

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def has_finished_requests(self) -> bool:
        return len(self.finished_req_ids) > 0

    def has_requests(self) -> bool:
        """Work left for schedule(): unfinished requests, or finished ids to report."""
        return self.has_unfinished_requests() or self.has_finished_requests()

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting)."""
        return len(self.running), len(self.waiting)

    # Scheduling ------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        kv = self.kv_cache_manager
        running = self.running
        token_budget = self.max_num_scheduled_tokens
        last_position = self.max_model_len - 1
        num_scheduled_tokens: dict[str, int] = {}
        new_blocks_of: dict[str, list[KVCacheBlock]] = {}
        scheduled_running: list[Request] = []
        scheduled_new: list[Request] = []
        preempted: list[Request] = []
        switched: list[Request] = []  # recomputed past longrope's switch (rope_switch_len)
        req_to_blocks = kv.req_to_blocks
        num_cached_block = kv.num_cached_block
        block_size = self.block_size
        caching = kv.enable_caching
        long_prefill = self.long_prefill_token_threshold

        # Running requests first, in order.
        req_index = 0
        while req_index < len(running) and token_budget > 0:
            request = running[req_index]
            num_computed = request.num_computed_tokens
            placeholders = request.num_output_placeholders
            if (
                placeholders > 0
                and num_computed + 2 - placeholders
                >= request.num_prompt_tokens + request.max_tokens
            ):
                # Async: the tokens in flight already reach max_tokens; no wasted step.
                req_index += 1
                continue
            num_new = request.num_tokens_with_spec + placeholders - num_computed
            if 0 < long_prefill < num_new:
                num_new = long_prefill
            if num_new > token_budget:
                num_new = token_budget
            # Input positions stay below max_model_len - 1: a token sampled there is the last.
            if num_new > last_position - num_computed:
                num_new = last_position - num_computed
            if num_new <= 0:
                req_index += 1
                continue
            if self._past_rope_switch(request, num_computed + num_new):
                # NOTE: its keys so far took the short factors; past the switch every key
                # takes the long ones: recompute it (it takes them on readmission, first in
                # line next step). Not memory pressure: the waiting queue is admitted on.
                del running[req_index]
                self._release_for_recompute(request)
                switched.append(request)
                continue

            # Fast path (most decode steps): the held blocks already have the slots and no block
            # becomes full, so allocate_slots would change nothing.
            end = num_computed + num_new
            blocks = req_to_blocks.get(request.request_id)
            if (
                blocks is not None
                and end <= len(blocks) * block_size
                and (
                    not caching or end // block_size <= num_cached_block.get(request.request_id, 0)
                )
            ):
                new_blocks = _NO_NEW_BLOCKS
            else:
                new_blocks = kv.allocate_slots(request, num_new)
            while new_blocks is None:
                if self.policy == "priority":
                    victim = max(running, key=_victim_key)
                    victim_index = running.index(victim)
                    del running[victim_index]
                    if victim_index < req_index:
                        req_index -= 1
                        victim_tokens = num_scheduled_tokens.pop(victim.request_id, None)
                        if victim_tokens is not None:
                            token_budget += victim_tokens
                            del new_blocks_of[victim.request_id]
                            scheduled_running.remove(victim)
                            # NOTE: its allocation registered blocks this step no longer fills.
                            kv.uncache_unwritten(victim, victim.num_computed_tokens)
                else:
                    victim = running.pop()
                self._preempt_request(victim)
                preempted.append(victim)
                if victim is request:
                    break
                new_blocks = kv.allocate_slots(request, num_new)
            if new_blocks is None:
                break

            scheduled_running.append(request)
            num_scheduled_tokens[request.request_id] = num_new
            new_blocks_of[request.request_id] = new_blocks
            token_budget -= num_new
            req_index += 1

        # Then waiting requests, unless this step had to preempt: waiting never preempts running.
        if not preempted:
            waiting = self.waiting
            compiling: list[Request] = []  # their grammar is not ready: skipped this step
            while waiting and token_budget > 0 and len(running) < self.max_num_running_reqs:
                request = waiting.peek_request()
                if request.waiting_for_grammar:
                    compiling.append(waiting.pop_request())
                    continue
                if request.num_output_placeholders > 0:
                    # Preempted with a token still in flight: resume once it has arrived, or
                    # the recomputation would sample that position a second time.
                    break
                if self._past_rope_switch(request, request.num_tokens):
                    request.take_long_rope()  # before its blocks are looked up: new hashes
                hits, num_hit_tokens = kv.get_computed_blocks(request)
                num_new = request.num_tokens - num_hit_tokens
                if 0 < long_prefill < num_new:
                    num_new = long_prefill
                if num_new > token_budget:
                    if not self.enable_chunked_prefill:
                        break
                    num_new = token_budget
                new_blocks = kv.allocate_slots(request, num_new, num_hit_tokens, hits)
                if new_blocks is None:
                    break
                waiting.pop_request()
                running.append(request)
                scheduled_new.append(request)
                if request.scheduled_time is None:
                    request.scheduled_time = time.monotonic()
                kv.record_prefix_cache_lookup(request, num_hit_tokens)
                num_scheduled_tokens[request.request_id] = num_new
                token_budget -= num_new
                request.status = _RUNNING
                request.num_computed_tokens = num_hit_tokens
                if request.num_cached_tokens < 0:
                    request.num_cached_tokens = num_hit_tokens
            for request in reversed(compiling):
                waiting.prepend_request(request)

        for request in reversed(switched):
            self.waiting.prepend_request(request)
        output = self._make_output(scheduled_new, scheduled_running, new_blocks_of,
                                   preempted + switched if switched else preempted)
        output.num_scheduled_tokens = num_scheduled_tokens
        output.total_num_scheduled_tokens = self.max_num_scheduled_tokens - token_budget
        self._update_after_schedule(scheduled_new, scheduled_running, num_scheduled_tokens)
        # The request objects this step serves: an id aborted and re-added while the step is in
        # flight names a new request, which must not receive the old one's token.
        self._scheduled_in[id(output)] = {
            r.request_id: r for r in (*scheduled_running, *scheduled_new)
        }
        return output

    def _make_output(
        self,
        scheduled_new: list[Request],
        scheduled_running: list[Request],
        new_blocks_of: dict[str, list[KVCacheBlock]],
        preempted: list[Request],
    ) -> SchedulerOutput:
        kv = self.kv_cache_manager
        new_reqs, cached = scheduled_request_data(scheduled_new, scheduled_running,
                                                  new_blocks_of, kv.get_block_ids)
        preempted_ids = {req.request_id for req in preempted}
        if self._preempted_outside_step:
            preempted_ids |= self._preempted_outside_step
            self._preempted_outside_step = set()
        finished = self.finished_req_ids
        self.finished_req_ids = set()
        running = self.running
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens={},
            total_num_scheduled_tokens=0,
            finished_req_ids=finished,
            preempted_req_ids=preempted_ids,
            num_common_prefix_blocks=(
                kv.get_num_common_prefix_blocks(running[0].request_id) if running else 0
            ),
        )

    def _update_after_schedule(
        self,
        scheduled_new: list[Request],
        scheduled_running: list[Request],
        num_scheduled_tokens: dict[str, int],
    ) -> None:
        # The output above carries the pre-step counts; advancing now lets the next schedule()
        # continue a chunked prefill before this step's output is back.
        for request in scheduled_running:
            request.num_computed_tokens += num_scheduled_tokens[request.request_id]
        for request in scheduled_new:
            request.num_computed_tokens += num_scheduled_tokens[request.request_id]

    def _preempt_request(self, request: Request) -> None:
        """Recompute-style preemption; the caller has removed it from ``running``."""
        self._release_for_recompute(request)
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend_request(request)

    def _release_for_recompute(self, request: Request) -> None:
        """Free a running request's blocks; it computes every token again when readmitted."""
        assert request.status == _RUNNING, f"only running requests are preempted: {request}"
        self.kv_cache_manager.free(request)
        request.status = _PREEMPTED
        request.num_computed_tokens = 0

    def flush_deferred_caching(self) -> None:
        """Register the blocks scheduled steps filled in the prefix cache (and hash them)."""
        self.kv_cache_manager.flush_deferred()

    def _free_request(self, request: Request) -> None:
        assert request.is_finished()
        req_id = request.request_id
        self.kv_cache_manager.free(request)
        del self.requests[req_id]
        self.finished_req_ids.add(req_id)
        self._finished_since_output.add(req_id)

    # Stats and maintenance -------------------------------------------------------------------
    def make_stats(self) -> SchedulerStats:
        kv = self.kv_cache_manager
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=kv.usage,
            prefix_cache_queries=kv.prefix_cache_stats.queries,
            prefix_cache_hits=kv.prefix_cache_stats.hits,
            num_preemptions=self.num_preemptions,
        )

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget all cached prefixes. Fails (False) while a request holds blocks, unless
        ``reset_running_requests`` preempts every running request first."""
        if reset_running_requests:
            # Preempt from the back so the requests come back in their running order.
            while self.running:
                request = self.running.pop()
                self._preempt_request(request)
                self._preempted_outside_step.add(request.request_id)
                # The request restarts from the tokens known now and samples the positions in
                # flight again, so each in-flight token (one per step still out) is dropped
                # when it arrives.
                request.num_stale_output_tokens += request.num_output_placeholders
                request.num_output_placeholders = 0
        return self.kv_cache_manager.reset_prefix_cache()
