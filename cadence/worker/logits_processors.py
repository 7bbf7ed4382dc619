"""Per-request logits processors: allowed token ids, bad words, logit bias, presence /
frequency / repetition penalties and min_p (vLLM's semantics and order).

The sampler applies them in vLLM v1's order: allowed ids, bad words, min_tokens and logit bias,
penalties; then (after greedy rows took their argmax and temperature was applied) min_p. Rows
that need none of them are never touched: each step gathers only the rows that do.

Penalties read device-resident per-slot state (``TokenCounts``): the count of every output
token and a mask of the prompt's tokens. A step's sampled ids are counted on the device right
after sampling, in stream order, so the next step's penalties include the token still in flight
to the host (async scheduling). Bad words need the last few output tokens: the host knows all
of them but the one in flight, which is read from the device (``last_sampled``). A thinking
budget's forced end tag (``thinking_budget``) comes last, over every other processor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from cadence.sampling_params import SamplingParams
from cadence.worker.thinking_budget import ForcedTokens, apply_forced

_NEG_INF = float("-inf")


@dataclass
class PenaltyRows:
    """The rows of one step that carry a penalty, with their state slots and parameters."""

    rows: torch.Tensor  # [P] int64: rows of the logits
    slots: torch.Tensor  # [P] int64: rows of TokenCounts
    presence: torch.Tensor  # [P, 1] float32
    frequency: torch.Tensor  # [P, 1] float32
    repetition: torch.Tensor  # [P, 1] float32


@dataclass
class ConditionalBans:
    """Bad-word bans whose last prefix token is still in flight: ban ``token`` in ``row`` when
    the slot's last sampled token equals ``needs``."""

    rows: torch.Tensor  # [C] int64
    slots: torch.Tensor  # [C] int64
    needs: torch.Tensor  # [C] int64
    tokens: torch.Tensor  # [C] int64


@dataclass
class LogitsInputs:
    """One step's inputs to the logits processors (rows are rows of the step's logits)."""

    allowed: dict[int, torch.Tensor]  # row -> allowed ids on the device
    bias: dict[int, tuple[torch.Tensor, torch.Tensor]]  # row -> (ids, values) on the device
    conditional: ConditionalBans | None
    forced: ForcedTokens | None  # thinking budgets: rows whose next token is the end tag
    penalties: PenaltyRows | None
    counts: torch.Tensor | None  # [slots, V] int32 output token counts (penalties)
    prompt_mask: torch.Tensor | None  # [slots, V] bool: tokens of the prompt (penalties)
    last_sampled: torch.Tensor | None  # [slots] the runner's last sampled token per slot


def apply_logits_processors(logits: torch.Tensor, inputs: LogitsInputs | None,
                            banned: dict[int, list[int]]) -> None:
    """Everything before temperature, in place on float32 ``logits`` [N, V]; ``banned``: row ->
    ids banned outright (min_tokens' stop ids, one-token bad words)."""
    if inputs is not None:
        for row, ids in inputs.allowed.items():
            keep = logits[row].index_select(0, ids)
            logits[row].fill_(_NEG_INF)
            logits[row].index_copy_(0, ids, keep)
    if banned:
        apply_banned_tokens(logits, banned)
    if inputs is None:
        return
    cond = inputs.conditional
    if cond is not None:
        assert inputs.last_sampled is not None
        hit = inputs.last_sampled.index_select(0, cond.slots) == cond.needs
        add = torch.where(hit, _NEG_INF, 0.0).to(logits.dtype)
        logits.index_put_((cond.rows, cond.tokens), add, accumulate=True)
    for row, (ids, values) in inputs.bias.items():
        logits[row].index_add_(0, ids, values)
    if inputs.penalties is not None:
        assert inputs.counts is not None and inputs.prompt_mask is not None
        apply_penalties(logits, inputs.penalties, inputs.counts, inputs.prompt_mask)
    if inputs.forced is not None:  # last: a forced token overrides every other processor
        apply_forced(logits, inputs.forced, inputs.last_sampled)


def apply_banned_tokens(logits: torch.Tensor, banned: dict[int, list[int]]) -> None:
    """Set ``logits[row, id] = -inf`` for every banned (row, id), in place."""
    rows: list[int] = []
    cols: list[int] = []
    vocab = logits.shape[-1]
    for row, ids in banned.items():
        for tok in ids:
            if 0 <= tok < vocab:
                rows.append(row)
                cols.append(tok)
    if rows:
        idx = to_device(torch.tensor([rows, cols], dtype=torch.int64), logits.device)
        logits.index_put_((idx[0], idx[1]), logits.new_full((), _NEG_INF))


def apply_penalties(logits: torch.Tensor, pen: PenaltyRows, counts: torch.Tensor,
                    prompt_mask: torch.Tensor) -> None:
    """Repetition (prompt and output tokens), then frequency and presence (output tokens), in
    place on the penalised rows (the OpenAI definitions; vLLM's order)."""
    sub = logits.index_select(0, pen.rows)
    c = counts.index_select(0, pen.slots)
    seen_out = c > 0
    seen = seen_out | prompt_mask.index_select(0, pen.slots)
    r = torch.where(seen, pen.repetition, 1.0)
    sub = torch.where(sub > 0, sub / r, sub * r)
    sub -= pen.frequency * c.to(sub.dtype)
    sub -= pen.presence * seen_out.to(sub.dtype)
    logits.index_copy_(0, pen.rows, sub)


def apply_min_p(logits: torch.Tensor, rows: torch.Tensor, min_p: torch.Tensor) -> None:
    """In ``rows``, mask the tokens whose probability is below ``min_p`` times the row's largest
    (after temperature), in place."""
    sub = logits.index_select(0, rows)
    probs = sub.softmax(dim=-1)
    top = probs.amax(dim=-1, keepdim=True)
    sub.masked_fill_(probs < min_p.unsqueeze(1) * top, _NEG_INF)
    logits.index_copy_(0, rows, sub)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        # NOTE: pinned and non-blocking: a pageable copy would wait for the GPU.
        return t.pin_memory().to(device, non_blocking=True)
    return t


def penalty_rows(rows: np.ndarray, slots: np.ndarray, params: Sequence[SamplingParams],
                 device: torch.device) -> PenaltyRows:
    """``rows`` of the logits (with their ``slots`` and ``params``) that carry a penalty."""
    f32 = np.float32
    packed = np.empty((3, len(rows)), dtype=f32)
    for i, p in enumerate(params):
        packed[:, i] = (p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
    idx = to_device(torch.from_numpy(np.stack([rows, slots]).astype(np.int64)), device)
    vals = to_device(torch.from_numpy(packed), device).unsqueeze(2)
    return PenaltyRows(rows=idx[0], slots=idx[1], presence=vals[0], frequency=vals[1],
                       repetition=vals[2])


def bad_word_bans(words: Sequence[Sequence[int]], history: Sequence[int], num_outputs: int
                  ) -> tuple[list[int], list[tuple[int, int]]]:
    """The bans of one row: ``history`` holds the first outputs the host knows, of
    ``num_outputs`` sampled so far (at most one more, still in flight). Returns the tokens banned
    outright and (needed last token, token) pairs banned only when the in-flight token matches.

    A word bans its last token when the outputs end with the rest of it (vLLM)."""
    in_flight = num_outputs - len(history)
    if in_flight not in (0, 1):
        raise RuntimeError(f"{in_flight} sampled tokens are unknown to the host; at most 1 can be")
    banned: list[int] = []
    conditional: list[tuple[int, int]] = []
    for word in words:
        prefix, last = list(word[:-1]), word[-1]
        if len(prefix) > num_outputs:
            continue
        if not prefix:
            banned.append(last)
        elif in_flight == 0:
            if list(history[len(history) - len(prefix):]) == prefix:
                banned.append(last)
        else:
            known = prefix[:-1]
            if not known or list(history[len(history) - len(known):]) == known:
                conditional.append((prefix[-1], last))
    return banned, conditional
