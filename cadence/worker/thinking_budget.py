"""vLLM's ``thinking_token_budget``: at most N tokens inside a reasoning block, then the end tag.

A request with a budget and its reasoning tags (start, end; one token each) is in a reasoning
block after a start tag that no end tag has followed yet, in its prompt or its output. Each
token sampled inside the block counts; once N have been (N = 0: none), the next token is the
end tag, forced: every other logit is -inf. The block ends there (or earlier, where the model
writes the end tag itself); a later start tag opens a new block, counted from 0.

Under async scheduling the token sampled in the step before may not be on the host yet: the
rule for the next token is then a condition on that token, read on the device (the runner's
last sampled token of the slot), so that a step never waits for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["ALWAYS", "UNLESS", "WHEN", "ForcedTokens", "ThinkingBudget", "apply_forced"]

_NEG_INF = float("-inf")

# How a forced token depends on the token still in flight (x): always; unless x is one of two
# tokens; only when x is a given token.
ALWAYS, UNLESS, WHEN = 0, 1, 2


class ThinkingBudget:
    """One request's reasoning block and its count, folded over the outputs the host knows."""

    def __init__(self, prompt: Sequence[int], tags: tuple[int, int], budget: int) -> None:
        self.start, self.end = tags
        self.budget = budget
        # The prompt's last tags, found from its end (at C speed: a long prompt with none).
        start, end = _last(prompt, self.start), _last(prompt, self.end)
        self.in_block = start > end
        self.count = len(prompt) - start - 1 if self.in_block else 0  # tokens inside it
        self._seen = 0  # outputs folded in

    def _take(self, token: int) -> None:
        if token == self.start:
            self.in_block, self.count = True, 0
        elif token == self.end:
            self.in_block, self.count = False, 0
        elif self.in_block:
            self.count += 1

    def rule(self, history: Sequence[int], num_outputs: int) -> tuple[int, int, int] | None:
        """How the next output token is forced to the end tag, given the ``history`` of outputs
        the host knows of ``num_outputs`` sampled (at most one in flight): ``(ALWAYS, _, _)``,
        ``(UNLESS, a, b)``: unless the in-flight token is a or b, ``(WHEN, a, _)``: when it is
        a; None: not forced."""
        for token in history[self._seen:]:
            self._take(token)
        self._seen = len(history)
        in_flight = num_outputs - len(history)
        if in_flight not in (0, 1):
            raise RuntimeError(f"{in_flight} sampled tokens are unknown to the host; at most 1 "
                               "can be")
        if in_flight == 0:
            return (ALWAYS, 0, 0) if self.in_block and self.count >= self.budget else None
        # The in-flight token x: a start tag opens a block of 0 tokens, an end tag closes it,
        # any other adds one to an open block.
        if self.in_block and self.count + 1 >= self.budget:
            spared = self.start if self.budget > 0 else self.end
            return (UNLESS, self.end, spared)
        if self.budget == 0:
            return (WHEN, self.start, self.start)
        return None


def _last(tokens: Sequence[int], token: int) -> int:
    """The index of ``token``'s last occurrence in ``tokens``; -1 if none."""
    try:
        return len(tokens) - 1 - list(reversed(tokens)).index(token)
    except ValueError:
        return -1


@dataclass
class ForcedTokens:
    """Rows of a step's logits whose token may be forced: each row's slot (for the in-flight
    token), its rule (``ALWAYS``, ``UNLESS``, ``WHEN``) with the rule's tokens, and the token."""

    rows: torch.Tensor  # [F] int64
    slots: torch.Tensor  # [F] int64
    mode: torch.Tensor  # [F] int64
    a: torch.Tensor  # [F] int64
    b: torch.Tensor  # [F] int64
    token: torch.Tensor  # [F] int64


def apply_forced(logits: torch.Tensor, forced: ForcedTokens,
                 last_sampled: torch.Tensor | None) -> None:
    """In place: each forced row keeps only its token's logit (the rest -inf), without a host
    sync (the in-flight token is compared on the device)."""
    if last_sampled is None:
        last = torch.zeros_like(forced.slots)
    else:
        last = last_sampled.index_select(0, forced.slots).to(torch.int64)
    force = torch.where(forced.mode == UNLESS, (last != forced.a) & (last != forced.b),
                        torch.where(forced.mode == WHEN, last == forced.a,
                                    torch.ones_like(last, dtype=torch.bool)))
    rows = logits.index_select(0, forced.rows)
    kept = rows.gather(1, forced.token[:, None])
    # A forced token that another processor banned comes anyway (vLLM sets it outright).
    kept = torch.where(force[:, None] & (kept == _NEG_INF), torch.zeros_like(kept), kept)
    rows = torch.where(force[:, None], torch.full_like(rows, _NEG_INF), rows)
    rows.scatter_(1, forced.token[:, None], kept)
    logits.index_copy_(0, forced.rows, rows)
