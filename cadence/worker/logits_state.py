"""The runner's per-request state for the logits processors, and each step's inputs to them.

Kept by batch slot on the device (penalty counts, ``TokenCounts``) and by request id on the host
(allowed ids and logit biases uploaded once on admission; the outputs the host knows, for bad
words). See ``logits_processors`` for what is applied and in which order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from cadence.runner_output import AsyncModelRunnerOutput, ModelRunnerOutput
from cadence.sampling_params import SamplingParams
from cadence.worker.logits_processors import (
    ConditionalBans,
    LogitsInputs,
    PenaltyRows,
    bad_word_bans,
    penalty_rows,
    to_device,
)
from cadence.worker.thinking_budget import ForcedTokens, ThinkingBudget


class TokenCounts:
    """Device-resident, per-slot token state for penalties: output token counts and the prompt's
    token mask. Rows are the runner's batch slots; only penalised requests' rows are kept."""

    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.counts = torch.zeros((max_num_reqs, vocab_size), dtype=torch.int32, device=device)
        self.prompt_mask = torch.zeros((max_num_reqs, vocab_size), dtype=torch.bool,
                                       device=device)

    @property
    def nbytes(self) -> int:
        return self.counts.nbytes + self.prompt_mask.nbytes

    def reset(self, slot: int, prompt: Sequence[int], outputs: Sequence[int]) -> None:
        """Fill ``slot`` for a request (re)admitted with ``prompt`` and known ``outputs``."""
        ids = to_device(torch.tensor(list(prompt) + list(outputs), dtype=torch.int64),
                        self.device)
        self.prompt_mask[slot].zero_()
        self.prompt_mask[slot].index_fill_(0, ids[: len(prompt)], True)
        self.counts[slot].zero_()
        out = ids[len(prompt):]
        if out.numel():
            self.counts[slot].index_add_(0, out, torch.ones_like(out, dtype=torch.int32))

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Rows ``src`` move to ``dst`` (all read before any is written)."""
        self.counts[dst] = self.counts[src]
        self.prompt_mask[dst] = self.prompt_mask[src]

    def count(self, pen: PenaltyRows, sampled: torch.Tensor) -> None:
        """Add the step's sampled ids of the penalised rows (``sampled`` [N] by logits row)."""
        toks = sampled.index_select(0, pen.rows)
        one = torch.ones_like(toks, dtype=torch.int32)
        self.counts.index_put_((pen.slots, toks), one, accumulate=True)



class LogitsState:
    """What the logits processors keep per request between steps."""

    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.token_counts = TokenCounts(max_num_reqs, vocab_size, device)
        self._allowed: dict[str, torch.Tensor] = {}
        self._bias: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        # Requests with bad words or a thinking budget: their outputs the host knows, in order.
        self._history: dict[str, list[int]] = {}
        self._thinking: dict[str, ThinkingBudget] = {}
        self._failed: dict[str, str] = {}  # requests whose processors could not run (id: why)

    def admit(self, slot: int, req_id: str, prompt: Sequence[int], outputs: Sequence[int],
              params: SamplingParams) -> None:
        """A request (re)admitted at ``slot`` (its final row after this step's moves)."""
        self.forget(req_id)
        if params.has_penalties:
            self.token_counts.reset(slot, prompt, outputs)
        if params.allowed_token_ids is not None:
            ids = sorted(set(params.allowed_token_ids))
            self._allowed[req_id] = to_device(torch.tensor(ids, dtype=torch.int64), self.device)
        if params.logit_bias:
            ids = list(params.logit_bias)
            vals = [float(params.logit_bias[t]) for t in ids]
            self._bias[req_id] = (
                to_device(torch.tensor(ids, dtype=torch.int64), self.device),
                to_device(torch.tensor(vals, dtype=torch.float32), self.device),
            )
        if params.bad_words_token_ids or params.thinking_token_budget is not None:
            self._history[req_id] = list(outputs)
        if params.thinking_token_budget is not None and params.thinking_tags is not None:
            self._thinking[req_id] = ThinkingBudget(prompt, params.thinking_tags,
                                                    params.thinking_token_budget)

    def forget(self, req_id: str) -> None:
        self._allowed.pop(req_id, None)
        self._bias.pop(req_id, None)
        self._history.pop(req_id, None)
        self._thinking.pop(req_id, None)

    def retain(self, live: Mapping[str, int]) -> None:
        """Drop the state of every request not in ``live`` (the batch's request ids)."""
        for table in (self._allowed, self._bias, self._history, self._thinking):
            for req_id in [r for r in table if r not in live]:
                del table[req_id]

    @property
    def active(self) -> bool:
        """Whether any request in the batch has bad words or a thinking budget (its outputs are
        recorded)."""
        return bool(self._history)

    def wants(self, req_id: str) -> object | None:
        """The request's admission (its history list) if its outputs are recorded."""
        return self._history.get(req_id)

    def record(self, req_id: str, index: int, token: int, admission: object) -> None:
        """Output ``index`` of ``req_id`` reached the host (recorded once, in order, into the
        admission it was sampled for)."""
        history = self._history.get(req_id)
        if history is not None and history is admission and len(history) == index:
            history.append(token)

    def step_inputs(
        self,
        rows: Sequence[int] | np.ndarray,
        req_ids: Sequence[str],
        slots: np.ndarray,
        params: Sequence[SamplingParams],
        num_outputs: Sequence[int],
        last_sampled: torch.Tensor,
    ) -> tuple[LogitsInputs | None, dict[int, list[int]]]:
        """The step's inputs for the sampling ``rows`` that have a processor (``req_ids``: their
        requests) and the bad-word tokens banned outright per row. ``slots``, ``params`` and
        ``num_outputs`` (tokens sampled so far) cover every sampling row."""
        pen: list[int] = []
        allowed: dict[int, torch.Tensor] = {}
        bias: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        banned: dict[int, list[int]] = {}
        cond: list[tuple[int, int, int, int]] = []
        forced: list[tuple[int, int, int, int, int, int]] = []
        for row, req_id in zip((int(r) for r in rows), req_ids, strict=True):
            p = params[row]
            if not p.needs_logits_processing:
                continue
            if p.has_penalties:
                pen.append(row)
            if req_id in self._allowed:
                allowed[row] = self._allowed[req_id]
            if req_id in self._bias:
                bias[row] = self._bias[req_id]
            history = self._history.get(req_id)
            try:
                if history is not None and p.bad_words_token_ids:
                    outright, needs = bad_word_bans(p.bad_words_token_ids, history,
                                                    num_outputs[row])
                    if outright:
                        banned[row] = outright
                    cond.extend((row, int(slots[row]), need, tok) for need, tok in needs)
                thinking = self._thinking.get(req_id)
                if thinking is not None and history is not None:
                    rule = thinking.rule(history, num_outputs[row])
                    if rule is not None:
                        forced.append((row, int(slots[row]), *rule, thinking.end))
            except RuntimeError as exc:  # its history lost step with its outputs: this
                self._failed[req_id] = str(exc)  # request fails, not the engine
        if not (pen or allowed or bias or cond or forced):
            return None, banned
        penalties = None
        if pen:
            rows = np.asarray(pen, dtype=np.int64)
            penalties = penalty_rows(rows, slots[rows], [params[r] for r in pen], self.device)
        conditional = None
        if cond:
            t = to_device(torch.tensor(cond, dtype=torch.int64).T.contiguous(), self.device)
            conditional = ConditionalBans(rows=t[0], slots=t[1], needs=t[2], tokens=t[3])
        counts = self.token_counts
        forced_tokens = None
        if forced:
            t = to_device(torch.tensor(forced, dtype=torch.int64).T.contiguous(), self.device)
            forced_tokens = ForcedTokens(rows=t[0], slots=t[1], mode=t[2], a=t[3], b=t[4],
                                         token=t[5])
        return LogitsInputs(
            allowed=allowed, bias=bias, conditional=conditional, forced=forced_tokens,
            penalties=penalties,
            counts=counts.counts if penalties is not None else None,
            prompt_mask=counts.prompt_mask if penalties is not None else None,
            last_sampled=last_sampled,
        ), banned

    def take_failed(self) -> dict[str, str]:
        """Requests whose processors could not be decided since the last call (id: why)."""
        failed, self._failed = self._failed, {}
        return failed

    def after_sampling(self, inputs: LogitsInputs | None, sampled: torch.Tensor) -> None:
        """Count the step's sampled ids of the penalised rows (on the device, in stream order)."""
        if inputs is not None and inputs.penalties is not None:
            self.token_counts.count(inputs.penalties, sampled)


class RecordingOutput:
    """A step's output that, once on the host, records the sampled tokens of ``tracked``
    (request id, output index, the admission's state) into ``state`` (bad-word and thinking
    history, grammar matchers).

    NOTE: under async scheduling this output is read after the next step ran; a request
    preempted or re-added in that step has a new admission, which the token must not reach
    (its history would run ahead of its outputs): ``record`` takes it only for the same
    admission's state object."""

    def __init__(self, inner: AsyncModelRunnerOutput, state: Any,
                 tracked: list[tuple[str, int, object]]) -> None:
        self.inner = inner
        self.state = state
        self.tracked = tracked

    def get_output(self) -> ModelRunnerOutput:
        out = self.inner.get_output()
        for req_id, index, admission in self.tracked:
            row = out.req_id_to_index.get(req_id)
            if row is not None and out.sampled_token_ids[row]:
                self.state.record(req_id, index, out.sampled_token_ids[row][0], admission)
        return out
