"""Requests with ``n > 1`` (vLLM v1's ``ParentRequest``): n child requests, one per choice, whose
outputs are merged back into the parent's.

The children are engine requests of their own (ids ``"{index}_{parent id}"``, n = 1, seeds
``seed + index``). Only the first goes to the engine core at once: the others follow when its
prompt is prefilled, so they find the prompt's KV blocks in the prefix cache and share them
instead of computing the prompt n times; children that read no cached block (prompt logprobs,
``skip_reading_prefix_cache``) all go at once.
"""

from __future__ import annotations

import copy
import dataclasses

from cadence.core_types import EngineCoreRequest
from cadence.outputs import CompletionOutput, RequestOutput
from cadence.sampling_params import RequestOutputKind

__all__ = ["ParentRequest", "child_request_id"]


def child_request_id(index: int, parent_id: str) -> str:
    return f"{index}_{parent_id}"


class ParentRequest:
    def __init__(self, request: EngineCoreRequest) -> None:
        params = request.sampling_params
        self.request_id = request.request_id
        self.n = params.n
        self.output_kind = params.output_kind
        self.children: list[EngineCoreRequest] = []
        for i in range(self.n):
            # NOTE: shallow: the children share the parent's read-only lists and dicts (a large
            # logit_bias copied n times would stall the event loop).
            child = copy.copy(params)
            child.n = 1
            if child.seed is not None:
                child.seed += i
            self.children.append(dataclasses.replace(
                request, request_id=child_request_id(i, request.request_id),
                sampling_params=child))
        self.child_ids = [c.request_id for c in self.children]
        self._index = {cid: i for i, cid in enumerate(self.child_ids)}
        # Sent once the first child's prompt is prefilled, unless they could not share it.
        self._deferred = self.children[1:] if params.reads_prefix_cache else []
        self._finished: list[CompletionOutput | None] = [None] * self.n
        # Metrics: choices ended so far, and the most tokens one of them generated.
        self._stats_seen = 0
        self._most_tokens = 0

    def sent_now(self) -> list[EngineCoreRequest]:
        """The children that go to the engine core at once."""
        return [c for c in self.children if self.sent(c.request_id)]

    def sent(self, child_id: str) -> bool:
        """Whether the child went to the engine core (the first at once, the others later)."""
        return all(c.request_id != child_id for c in self._deferred)

    def observe_finished(self, num_generation_tokens: int) -> int | None:
        """Count one choice's end (for metrics); on the last of the n, the most tokens any
        choice generated, else None."""
        self._stats_seen += 1
        self._most_tokens = max(self._most_tokens, num_generation_tokens)
        return self._most_tokens if self._stats_seen == self.n else None

    def index_of(self, child_id: str) -> int:
        return self._index[child_id]

    def take_deferred(self) -> list[EngineCoreRequest]:
        """The children still to send to the engine core (once)."""
        deferred, self._deferred = self._deferred, []
        return deferred

    def forget_deferred(self, child_ids: set[str]) -> None:
        """Children aborted before they were sent: they never will be."""
        self._deferred = [c for c in self._deferred if c.request_id not in child_ids]

    @property
    def finished(self) -> bool:
        return all(c is not None for c in self._finished)

    def merge(self, child_id: str, out: RequestOutput) -> RequestOutput | None:
        """The parent's output for one child's ``out`` (None: nothing to hand out yet).

        Streaming kinds hand each child's completion on at once, as choice ``index``; the
        parent is finished with its last child. FINAL_ONLY waits for every child."""
        index = self._index[child_id]
        completion = dataclasses.replace(out.outputs[0], index=index)
        if completion.finished():
            self._finished[index] = completion
        done = self.finished
        if self.output_kind == RequestOutputKind.FINAL_ONLY:
            if not done:
                return None
            outputs = [c for c in self._finished if c is not None]
        else:
            outputs = [completion]
        return dataclasses.replace(out, request_id=self.request_id, outputs=outputs,
                                   finished=done)
