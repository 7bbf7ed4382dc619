"""Scheduling one step ahead of the outputs (vLLM v1 ``AsyncScheduler``).

Step N+1 is scheduled before step N's sampled tokens reach the host. Each request that samples
in a step gets an output placeholder; ``num_new_tokens`` counts placeholders as known tokens, so
a decoding request is scheduled for the position whose input id is still on the device. The
placeholder is drained when the token arrives.
"""

from __future__ import annotations

from cadence.scheduler.request import Request, RequestStatus
from cadence.scheduler.scheduler import Scheduler
from cadence.scheduler.stop import check_stop

_RUNNING = RequestStatus.RUNNING


class AsyncScheduler(Scheduler):
    def _update_after_schedule(
        self,
        scheduled_new: list[Request],
        scheduled_running: list[Request],
        num_scheduled_tokens: dict[str, int],
    ) -> None:
        for requests in (scheduled_running, scheduled_new):
            for request in requests:
                num_computed = (
                    request.num_computed_tokens + num_scheduled_tokens[request.request_id]
                )
                request.num_computed_tokens = num_computed
                # A step that reaches every known token (placeholders included) samples one.
                if num_computed >= request.num_tokens + request.num_output_placeholders:
                    request.num_output_placeholders += 1

    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int]
    ) -> tuple[list[int], bool]:
        if request.num_stale_output_tokens:
            # Sampled before a forced reset; the request has been rescheduled from scratch.
            request.num_stale_output_tokens -= 1
            return [], False
        status_before = request.status
        if len(new_token_ids) == 1:  # the per-step case, without the base class's extra call
            request.append_output_token_ids(new_token_ids[0])
            stopped = check_stop(request, self.max_model_len)
        else:
            new_token_ids, stopped = super()._update_request_with_output(request, new_token_ids)
        placeholders = request.num_output_placeholders - len(new_token_ids)
        assert placeholders >= 0
        request.num_output_placeholders = placeholders
        if status_before == _RUNNING:
            # Only blocks whose tokens are all known (none in flight) can be hashed.
            num_known = request.num_computed_tokens - placeholders
            kv = self.kv_cache_manager
            if num_known // self.block_size > kv.num_cached_block.get(request.request_id, 0):
                kv.cache_blocks(request, num_known)
        return new_token_ids, stopped
