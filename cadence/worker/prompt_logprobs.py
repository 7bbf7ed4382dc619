"""Logprobs of prompt tokens (vLLM's ``prompt_logprobs``): for each prompt token after the first,
its logprob and rank given the tokens before it, plus the top-k, computed from the hidden states
of the prefill chunks that hold those positions.

Rare and heavy (a vocabulary-wide row per prompt token), so it runs only for the requests that
ask, in slices that bound the memory of one logits block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from cadence.runner_output import AsyncModelRunnerOutput, ModelRunnerOutput
from cadence.worker.input_batch import InputBatch, StepInputs
from cadence.worker.logits_processors import to_device
from cadence.worker.sampler import LogprobsTensors, gather_logprobs

_SLICE = 256  # prompt positions whose logits are materialised at once


@dataclass
class PromptChunk:
    """Prompt tokens ``first .. first + n - 1`` of one request, scored this step."""

    req_id: str
    first: int  # index in the prompt of the first scored token (>= 1)
    flat: int  # flat index (into the step's hidden states) of the position predicting it
    targets: np.ndarray  # [n] the scored prompt token ids
    k: int  # top logprobs wanted per token


def prompt_chunks(inp: StepInputs, batch: InputBatch) -> list[PromptChunk]:
    """The prompt tokens this step scores: a position predicts the token after it, so a chunk
    of positions [start, end) scores prompt tokens start + 1 .. min(end, P - 1)."""
    chunks = []
    for row, req_id in enumerate(inp.req_ids):
        slot = int(inp.slots[row])
        params = batch.params[slot]
        if params is None or params.prompt_logprobs is None:
            continue
        flat = int(inp.query_start_loc[row])
        start = int(inp.positions[flat])
        last = min(int(inp.seq_lens[row]), int(batch.num_prompt[slot]) - 1)
        if last <= start:
            continue
        targets = batch.token_ids[slot, start + 1 : last + 1].copy()
        chunks.append(PromptChunk(req_id, start + 1, flat, targets, params.prompt_logprobs))
    return chunks


def score_prompt(hidden: torch.Tensor, chunk: PromptChunk,
                 compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> LogprobsTensors:
    """Logprob and rank of each scored token and the top-k of its position, on the device."""
    n = len(chunk.targets)
    targets = to_device(torch.from_numpy(chunk.targets), hidden.device)
    parts = []
    for lo in range(0, n, _SLICE):
        hi = min(n, lo + _SLICE)
        logits = compute_logits(hidden[chunk.flat + lo : chunk.flat + hi])
        lp = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        parts.append(gather_logprobs(lp, chunk.k, targets[lo:hi]))
    if len(parts) == 1:
        return parts[0]
    return LogprobsTensors(torch.cat([p.logprob_token_ids for p in parts]),
                           torch.cat([p.logprobs for p in parts]),
                           torch.cat([p.sampled_token_ranks for p in parts]))


class WithPromptLogprobs:
    """A step's output plus its prompt logprobs, read to the host with it."""

    def __init__(self, inner: AsyncModelRunnerOutput,
                 scored: dict[str, tuple[int, LogprobsTensors]],
                 wait: Callable[[], None] | None = None) -> None:
        """``wait``: makes the scoring's stream work visible to the host, for a step whose
        output has no copy to wait on (no request sampled)."""
        self.inner = inner
        self.scored = scored
        self.wait = wait

    def get_output(self) -> ModelRunnerOutput:
        out = self.inner.get_output()
        if self.wait is not None:
            self.wait()
        # NOTE: a deliberate sync, only on steps that score prompt tokens (a rare option).
        for req_id, (first, tensors) in self.scored.items():
            out.prompt_logprobs[req_id] = (first, tensors.tolists())
        return out
