"""Moving a step's sampled ids (and logprobs) to the host.

CPU: the tensors already live on the host; the output is ready at once. CUDA: the ids are copied
on a dedicated copy stream, after it waits on an event recorded on the main stream, into a pinned
slot; ``get_output()`` waits only on that copy's event. Slots are allocated once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from cadence.worker.output import (
    AsyncModelRunnerOutput,
    LogprobsLists,
    ModelRunnerOutput,
    ReadyOutput,
)


def build_output(req_ids: list[str], rows: np.ndarray, sampled: list[int],
                 logprobs: tuple[list[list[int]], list[list[float]], list[int]] | None
                 ) -> ModelRunnerOutput:
    per_row: list[list[int]] = [[] for _ in req_ids]
    for i, row in enumerate(rows.tolist()):
        per_row[row] = [sampled[i]]
    lp = None
    if logprobs is not None:
        ids, vals, ranks = logprobs
        lp = LogprobsLists([[] for _ in req_ids], [[] for _ in req_ids], [0] * len(req_ids))
        for i, row in enumerate(rows.tolist()):
            lp.logprob_token_ids[row] = ids[i]
            lp.logprobs[row] = vals[i]
            lp.sampled_token_ranks[row] = ranks[i]
    return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, per_row, lp)


def _logprob_lists(lp) -> tuple[list[list[int]], list[list[float]], list[int]] | None:
    if lp is None:
        return None
    return lp.logprob_token_ids.tolist(), lp.logprobs.tolist(), lp.sampled_token_ranks.tolist()


class CpuOutputCopier:
    def start(self, req_ids: list[str], rows: np.ndarray, sampled) -> AsyncModelRunnerOutput:
        return ReadyOutput(build_output(req_ids, rows, sampled.sampled_token_ids.tolist(),
                                        _logprob_lists(sampled.logprobs)))


@dataclass
class _PendingCopy:
    copier: CudaOutputCopier
    slot: int
    n: int
    req_ids: list[str]
    rows: np.ndarray
    logprobs: object | None  # device tensors, copied synchronously at consume time (rare)

    def get_output(self) -> ModelRunnerOutput:
        return self.copier.finish(self)


class CudaOutputCopier:
    """Pinned slots + copy stream (torch primitives)."""

    def __init__(self, device: torch.device, max_rows: int, num_slots: int = 4) -> None:
        self.device = device
        self.copy_stream = torch.cuda.Stream(device=device)
        self.host = [torch.empty(max_rows, dtype=torch.int64, pin_memory=True)
                     for _ in range(num_slots)]
        self.main_done = [torch.cuda.Event() for _ in range(num_slots)]
        self.copy_done = [torch.cuda.Event() for _ in range(num_slots)]
        self.free = deque(range(num_slots))

    def start(self, req_ids: list[str], rows: np.ndarray, sampled) -> AsyncModelRunnerOutput:
        if not self.free:
            raise RuntimeError("all output slots are in flight; consume an output first")
        slot = self.free.popleft()
        ids = sampled.sampled_token_ids
        n = ids.shape[0]
        main = torch.cuda.current_stream(self.device)
        self.main_done[slot].record(main)
        # NOTE: the copy stream is never captured in a graph; it only waits on the main stream.
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(self.main_done[slot])
            self.host[slot][:n].copy_(ids, non_blocking=True)
            ids.record_stream(self.copy_stream)
            self.copy_done[slot].record(self.copy_stream)
        return _PendingCopy(self, slot, n, req_ids, rows, sampled.logprobs)

    def finish(self, pending: _PendingCopy) -> ModelRunnerOutput:
        self.copy_done[pending.slot].synchronize()  # NOTE: waits for this step's copy only
        sampled = self.host[pending.slot][: pending.n].tolist()
        self.free.append(pending.slot)
        return build_output(pending.req_ids, pending.rows, sampled,
                            _logprob_lists(pending.logprobs))


def make_output_copier(device: torch.device, max_rows: int):
    if device.type == "cuda":
        return CudaOutputCopier(device, max_rows)
    return CpuOutputCopier()
