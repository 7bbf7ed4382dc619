"""Moving a step's sampled ids (and logprobs) to the host through the runtime's slot pool.

``start`` borrows a slot and stages the sampled ids: a snapshot on the main stream, then a
device-to-host copy on the copy stream after it waits on an event recorded on the main stream.
``get_output()`` waits only on that slot's event, then returns the slot. On the CPU backend the
same calls degenerate to synchronous copies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from cadence.runner_output import LogprobsLists, ModelRunnerOutput

# At most two steps are in flight (depth-2 batch queue); spare slots absorb the rest.
_NUM_SLOTS = 4


def build_output(req_ids: list[str], rows: np.ndarray, sampled: list[int],
                 logprobs: tuple[list[list[int]], list[list[float]], list[int]] | None
                 ) -> ModelRunnerOutput:
    per_row: list[list[int]] = [[] for _ in req_ids]
    row_list = rows.tolist()
    for i, row in enumerate(row_list):
        per_row[row] = [sampled[i]]
    lp = None
    if logprobs is not None:
        ids, vals, ranks = logprobs
        lp = LogprobsLists([[] for _ in req_ids], [[] for _ in req_ids], [0] * len(req_ids))
        for i, row in enumerate(row_list):
            lp.logprob_token_ids[row] = ids[i]
            lp.logprobs[row] = vals[i]
            lp.sampled_token_ranks[row] = ranks[i]
    return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, per_row, lp)


@dataclass
class PendingOutput:
    copier: OutputCopier
    slot: object
    n: int
    req_ids: list[str]
    rows: np.ndarray
    logprobs: object | None

    done: bool = False

    def get_output(self) -> ModelRunnerOutput:
        self.done = True
        return self.copier.finish(self)

    def peek(self) -> dict[str, int]:
        """The sampled token of each request of this step, before ``get_output`` (waits for
        this step's copy only); empty once the output was taken."""
        if self.done:
            return {}
        sampled = self.slot.fetch(self.n).tolist()
        return {self.req_ids[row]: sampled[i] for i, row in enumerate(self.rows.tolist())}


class OutputCopier:
    def __init__(self, rt, main, copy, max_rows: int) -> None:
        self.main = main
        self.copy = copy
        self.pool = rt.create_slot_pool(_NUM_SLOTS, max_rows, torch.int64)
        self.last: PendingOutput | None = None  # the newest step's (read by structured outputs)
        # Seconds the host has spent waiting in finish() for outputs' copies: the GPU (not the
        # host) setting the pace. Read by benchmarks.
        self.wait_s = 0.0

    def start(self, req_ids: list[str], rows: np.ndarray, sampled: torch.Tensor, n: int,
              logprobs) -> PendingOutput:
        slot = self.pool.borrow()
        slot.stage(sampled, n, main=self.main, copy=self.copy)
        self.last = PendingOutput(self, slot, n, req_ids, rows, logprobs)
        return self.last

    def peek_last(self) -> dict[str, int]:
        """The last step's tokens by request while its output is still in flight."""
        return self.last.peek() if self.last is not None else {}

    def finish(self, pending: PendingOutput) -> ModelRunnerOutput:
        started = time.perf_counter()
        sampled = pending.slot.fetch(pending.n).tolist()  # waits for this slot's copy only
        self.wait_s += time.perf_counter() - started
        self.pool.release(pending.slot)
        lp = pending.logprobs
        if lp is not None:
            # NOTE: logprobs are rare and larger; they are read synchronously at consume time,
            # after fetch() waited on this step's copy (so the sampler that made them is done).
            lists = lp.tolists()
            lp = (lists.logprob_token_ids, lists.logprobs, lists.sampled_token_ranks)
        return build_output(pending.req_ids, pending.rows, sampled, lp)

    def close(self) -> None:
        self.pool.close()
