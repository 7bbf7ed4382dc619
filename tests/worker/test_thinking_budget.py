"""The thinking budget's rule against the rule written out over whole token lists, for the
host's known outputs and a token still in flight; and the forcing of logits rows."""

from __future__ import annotations

import random

import pytest
import torch

from cadence.worker.thinking_budget import ForcedTokens, ThinkingBudget, apply_forced

START, END = 1, 2
ALPHABET = [0, START, END, 3, 4]


def forced_after(tokens: list[int], budget: int) -> bool:
    """Written out: the next token is forced when the last start tag is not followed by an end
    tag and at least ``budget`` tokens came after it."""
    last_start = max((i for i, t in enumerate(tokens) if t == START), default=-1)
    last_end = max((i for i, t in enumerate(tokens) if t == END), default=-1)
    return last_start > last_end and len(tokens) - last_start - 1 >= budget


def _decide(rule: tuple[int, int, int] | None, x: int) -> bool:
    if rule is None:
        return False
    mode, a, b = rule
    return {0: True, 1: x not in (a, b), 2: x == a}[mode]


@pytest.mark.parametrize("budget", [0, 1, 2, 5])
def test_the_rule_forces_exactly_where_the_written_rule_does(budget: int) -> None:
    rng = random.Random(budget)
    for _ in range(200):
        prompt = [rng.choice(ALPHABET) for _ in range(rng.randint(0, 6))]
        outputs = [rng.choice(ALPHABET) for _ in range(rng.randint(0, 12))]
        state = ThinkingBudget(prompt, (START, END), budget)
        for known in range(len(outputs) + 1):  # the host learns the outputs one by one
            history = outputs[:known]
            assert _decide(state.rule(history, known), 0) == forced_after(prompt + history, budget)
            for x in ALPHABET:  # one more sampled, still in flight
                fresh = ThinkingBudget(prompt, (START, END), budget)
                rule = fresh.rule(history, known + 1)
                assert _decide(rule, x) == forced_after(prompt + history + [x], budget), (
                    prompt, history, x)


def test_more_than_one_unknown_token_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="at most 1"):
        ThinkingBudget([START], (START, END), 3).rule([], 2)


def test_forced_rows_keep_only_their_token() -> None:
    logits = torch.randn(4, 8)
    logits[2, 5] = float("-inf")  # banned by another processor: forced anyway
    before = logits.clone()
    last = torch.tensor([3, 2, 7, 0])  # by slot
    forced = ForcedTokens(rows=torch.tensor([0, 1, 2, 3]), slots=torch.tensor([0, 1, 2, 3]),
                          mode=torch.tensor([0, 1, 2, 1]), a=torch.tensor([0, 2, 7, 2]),
                          b=torch.tensor([0, 1, 7, 1]), token=torch.tensor([4, 4, 5, 6]))
    apply_forced(logits, forced, last)
    # Row 0 always; row 1 unless the in-flight token is 2 or 1 (it is 2): untouched; row 2
    # when it is 7 (it is); row 3 unless 2 or 1 (it is 0): forced.
    for row, token in ((0, 4), (2, 5), (3, 6)):
        assert torch.isinf(logits[row]).sum() == 7 and torch.isfinite(logits[row, token])
    assert logits[0, 4] == before[0, 4] and logits[2, 5] == 0.0
    torch.testing.assert_close(logits[1], before[1])


def test_a_row_not_forced_this_step_keeps_its_bans() -> None:
    """The end tag (1) that another processor banned stays banned on a row whose rule does
    not fire (WHEN the in-flight token is 3; it is 2): only a forced row lifts the ban."""
    logits = torch.tensor([[1.0, float("-inf"), 2.0, 0.5]])
    forced = ForcedTokens(rows=torch.tensor([0]), slots=torch.tensor([0]),
                          mode=torch.tensor([2]), a=torch.tensor([3]), b=torch.tensor([3]),
                          token=torch.tensor([1]))
    apply_forced(logits, forced, torch.tensor([2]))
    assert logits.tolist() == [[1.0, float("-inf"), 2.0, 0.5]]
