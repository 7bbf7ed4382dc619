"""Noticing that the engine cannot make progress, instead of spinning on empty steps.

A step that schedules nothing while requests wait, none runs and no step is in flight can only
repeat itself: nothing will free a KV block or change the queue. In a correct engine that does
not happen (every request was checked at admission to fit the whole KV cache and the step's
budget), so it is a bug, e.g. KV blocks that were never returned. The engine core raises
``SchedulerStalledError`` with the cause: ``LLM.generate`` fails with it, and a server goes
through its engine-fault path instead of hanging.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cadence.scheduler.scheduler import Scheduler

__all__ = ["SchedulerStalledError", "stall_reason"]


class SchedulerStalledError(RuntimeError):
    """Requests wait that nothing will ever schedule."""


def stall_reason(scheduler: Scheduler) -> str | None:
    """Why the waiting requests can never be scheduled, given that the last ``schedule()``
    scheduled nothing and no step is in flight; None if this is not a stall."""
    if scheduler.running or not scheduler.waiting:
        return None
    if any(r.waiting_for_grammar for r in scheduler.waiting):
        return None  # a grammar is compiling: the engine waits for it (``grammars_pending``)
    request = scheduler.waiting.peek_request()
    if request.num_output_placeholders > 0:
        return None  # its token is still in flight
    kv = scheduler.kv_cache_manager
    rid, n = request.request_id, request.num_tokens
    budget = scheduler.max_num_scheduled_tokens
    if n - request.num_computed_tokens > budget and not scheduler.enable_chunked_prefill:
        return (
            f"request {rid} needs {n} tokens in one step but max_num_batched_tokens is "
            f"{budget} and chunked prefill is off"
        )
    usable = kv.num_usable_blocks
    free = kv.block_pool.get_num_free_blocks()
    needed = -(-n // kv.block_size)
    held = usable - free
    if held > 0:
        return (
            f"request {rid} needs {needed} KV blocks and only {free} of {usable} are free, "
            f"yet no request is running: {held} blocks are held by no running request "
            f"(a KV block leak)"
        )
    return (
        f"request {rid} ({n} tokens, {needed} KV blocks) cannot be scheduled although all "
        f"{usable} KV blocks are free and no request is running"
    )
