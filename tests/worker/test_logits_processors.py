"""The logits processors against transformers' own processors and plain references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadence.sampling_params import SamplingParams
from cadence.worker.logits_processors import (
    apply_logits_processors,
    apply_min_p,
    apply_penalties,
    bad_word_bans,
    penalty_rows,
)
from cadence.worker.logits_state import LogitsState, TokenCounts
from cadence.worker.sampler import Sampler, SamplingMetadata

V = 50


def _logits(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, V, generator=g) * 3


def _state(prompts, outputs, params) -> LogitsState:
    state = LogitsState(len(prompts), V, torch.device("cpu"))
    for slot, (pr, out, p) in enumerate(zip(prompts, outputs, params)):
        state.admit(slot, f"r{slot}", pr, out, p)
    return state


def test_repetition_penalty_matches_transformers():
    from transformers import RepetitionPenaltyLogitsProcessor

    prompts = [[1, 5, 5, 9], [3, 4], [7]]
    outputs = [[9, 11, 11], [], [40, 41, 7]]
    penalties = [1.5, 0.7, 2.0]
    params = [SamplingParams(repetition_penalty=r) for r in penalties]
    logits = _logits(3)
    got = logits.clone()
    state = _state(prompts, outputs, params)
    inputs, _ = state.step_inputs(np.arange(3), ["r0", "r1", "r2"], np.arange(3), params, [3, 0, 3],
                                  torch.zeros(3, dtype=torch.int64))
    apply_logits_processors(got, inputs, {})
    for row in range(3):
        proc = RepetitionPenaltyLogitsProcessor(penalties[row])
        ids = torch.tensor([prompts[row] + outputs[row]])
        want = proc(ids, logits[row : row + 1].clone())[0]
        torch.testing.assert_close(got[row], want)


def test_presence_and_frequency_penalties_match_a_reference():
    outputs = [[4, 4, 4, 9], [0, 1, 2, 2]]
    pres, freq = [0.5, -1.0], [0.3, 1.5]
    params = [SamplingParams(presence_penalty=p, frequency_penalty=f) for p, f in zip(pres, freq)]
    logits = _logits(2, seed=1)
    got = logits.clone()
    counts = TokenCounts(2, V, torch.device("cpu"))
    for slot, out in enumerate(outputs):
        counts.reset(slot, [10, 11], out)
    pen = penalty_rows(np.arange(2), np.arange(2), params, torch.device("cpu"))
    apply_penalties(got, pen, counts.counts, counts.prompt_mask)
    want = logits.clone().numpy()
    for row, out in enumerate(outputs):
        for tok in set(out):
            want[row, tok] -= freq[row] * out.count(tok) + pres[row]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_counts_accumulate_repeated_tokens_in_a_step():
    counts = TokenCounts(3, V, torch.device("cpu"))
    params = [SamplingParams(frequency_penalty=1.0)] * 2
    for slot in range(3):
        counts.reset(slot, [1], [])
    # Rows 0 and 1 of the logits are slots 2 and 0.
    pen = penalty_rows(np.array([0, 1]), np.array([2, 0]), params, torch.device("cpu"))
    counts.count(pen, torch.tensor([7, 7]))
    counts.count(pen, torch.tensor([7, 8]))
    assert counts.counts[2, 7] == 2 and counts.counts[0, 7] == 1 and counts.counts[0, 8] == 1
    assert int(counts.counts[1].sum()) == 0


def test_counts_move_with_their_rows():
    counts = TokenCounts(3, V, torch.device("cpu"))
    counts.reset(2, [5], [6, 6])
    counts.move(torch.tensor([2]), torch.tensor([0]))
    assert counts.counts[0, 6] == 2 and bool(counts.prompt_mask[0, 5])


def test_a_reused_slot_forgets_the_previous_requests_tokens():
    """A slot a new request takes holds only its own prompt and outputs: the repetition
    penalty reads the prompt mask, so an old prompt's tokens left in it would be penalised."""
    counts = TokenCounts(2, V, torch.device("cpu"))
    counts.reset(0, [1, 2], [3, 3])
    counts.reset(0, [4], [])
    assert torch.nonzero(counts.prompt_mask[0]).flatten().tolist() == [4]
    assert int(counts.counts[0].sum()) == 0


@pytest.mark.parametrize("min_p", [0.05, 0.3, 1.0])
def test_min_p_matches_transformers(min_p):
    from transformers import MinPLogitsWarper

    logits = _logits(4, seed=2) / 0.7
    got = logits.clone()
    apply_min_p(got, torch.arange(4), torch.full((4,), min_p))
    want = MinPLogitsWarper(min_p)(torch.zeros(4, 1, dtype=torch.long), logits.clone())
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got[~torch.isinf(got)], logits[~torch.isinf(got)])


def test_min_p_only_touches_its_rows():
    logits = _logits(3, seed=3)
    got = logits.clone()
    apply_min_p(got, torch.tensor([1]), torch.tensor([0.5]))
    assert torch.equal(got[0], logits[0]) and torch.equal(got[2], logits[2])
    assert torch.isinf(got[1]).any()


def test_allowed_ids_and_logit_bias():
    params = [SamplingParams(allowed_token_ids=[3, 9, 9, 20]),
              SamplingParams(logit_bias={4: 100.0, 5: -7.5}),
              SamplingParams()]
    logits = _logits(3, seed=4)
    got = logits.clone()
    state = _state([[1]] * 3, [[]] * 3, params)
    inputs, _ = state.step_inputs(np.arange(3), ["r0", "r1", "r2"], np.arange(3), params, [0, 0, 0],
                                  torch.zeros(3, dtype=torch.int64))
    apply_logits_processors(got, inputs, {})
    allowed = torch.zeros(V, dtype=torch.bool)
    allowed[[3, 9, 20]] = True
    assert torch.isinf(got[0][~allowed]).all()
    assert torch.equal(got[0][allowed], logits[0][allowed])
    want = logits[1].clone()
    want[4] += 100.0
    want[5] -= 7.5
    torch.testing.assert_close(got[1], want)
    assert torch.equal(got[2], logits[2])


def test_rows_without_processors_get_no_inputs():
    params = [SamplingParams(temperature=0.5), SamplingParams()]
    state = _state([[1], [2]], [[], []], params)
    inputs, bans = state.step_inputs(np.arange(2), ["r0", "r1"], np.arange(2), params, [0, 0],
                                     torch.zeros(2, dtype=torch.int64))
    assert inputs is None and bans == {}


def test_bad_word_bans_follow_the_outputs():
    words = [[7], [1, 2], [3, 4, 5]]
    # Nothing sampled yet: only the one-token word and first tokens... of no word beyond it.
    assert bad_word_bans(words, [], 0) == ([7], [])
    # The host knows every output.
    assert bad_word_bans(words, [9, 1], 2) == ([7, 2], [])
    assert bad_word_bans(words, [3, 4], 2) == ([7, 5], [])
    assert bad_word_bans(words, [4, 3], 2) == ([7], [])
    # One output in flight: the ban waits on it.
    assert bad_word_bans(words, [9], 2) == ([7], [(1, 2)])
    assert bad_word_bans(words, [3], 2) == ([7], [(1, 2), (4, 5)])
    assert bad_word_bans(words, [8], 2) == ([7], [(1, 2)])
    with pytest.raises(RuntimeError):
        bad_word_bans(words, [], 2)


def test_conditional_bans_read_the_in_flight_token():
    params = [SamplingParams(), SamplingParams()]
    for p in params:
        p.bad_words_token_ids = [[1, 2]]
    state = _state([[9], [9]], [[], []], params)
    last_sampled = torch.tensor([1, 3])  # slot 0 sampled 1 (in flight), slot 1 sampled 3
    inputs, bans = state.step_inputs(np.arange(2), ["r0", "r1"], np.arange(2), params, [1, 1],
                                     last_sampled)
    assert bans == {}
    logits = _logits(2, seed=5)
    got = logits.clone()
    apply_logits_processors(got, inputs, bans)
    assert torch.isinf(got[0, 2]) and not torch.isinf(got[1]).any()
    # Once the token reaches the host, the same ban is decided there.
    admission = state.wants("r0")
    state.record("r0", 0, 1, admission)
    state.record("r0", 0, 1, admission)  # recorded once
    _, bans = state.step_inputs(np.arange(1), ["r0"], np.arange(1), params[:1], [1], last_sampled)
    assert bans == {0: [2]}


def test_conditional_bans_read_the_slot_of_their_row():
    """A request's row in the step and its slot in the state differ (row 0, slot 1): its ban
    on 2 after 1 reads the token its slot has in flight, and lands on its row."""
    p = SamplingParams()
    p.bad_words_token_ids = [[1, 2]]
    state = LogitsState(2, V, torch.device("cpu"))
    state.admit(1, "r", [9], [], p)
    last_sampled = torch.tensor([3, 1])  # slot 1 has 1 in flight; slot 0 (another) has 3
    inputs, bans = state.step_inputs(np.arange(1), ["r"], np.array([1]), [p], [1],
                                     last_sampled)
    got = _logits(1, seed=6)
    apply_logits_processors(got, inputs, bans)
    assert torch.isinf(got[0, 2]) and int(torch.isinf(got[0]).sum()) == 1


def test_sampler_order_penalties_before_greedy_and_min_p_after_temperature():
    """Greedy rows take the argmax of the penalised logits; min_p is relative to the tempered
    distribution."""
    logits = torch.tensor([[5.0, 4.9, 0.0, -1.0], [2.0, 1.0, 0.0, -30.0]])
    params = [SamplingParams(temperature=0.0, presence_penalty=1.0),
              SamplingParams(temperature=2.0, min_p=0.5, seed=3)]
    state = LogitsState(2, 4, torch.device("cpu"))
    state.admit(0, "a", [1], [0], params[0])
    state.admit(1, "b", [1], [], params[1])
    md = SamplingMetadata.from_params(params, [1, 0])
    md.processors, _ = state.step_inputs(np.arange(2), ["a", "b"], np.arange(2), params, [1, 0],
                                         torch.zeros(2, dtype=torch.int64))
    for _ in range(20):
        out = Sampler()(logits, md).sampled_token_ids.tolist()
        assert out[0] == 1  # token 0 was seen: 5 - 1 < 4.9
        # At temperature 2, p(1)/p(0) = e^-0.5 > 0.5 and p(2)/p(0) = e^-1 < 0.5.
        assert out[1] in (0, 1)


def test_all_greedy_steps_take_the_argmax_of_the_penalised_logits():
    """A step whose rows are all greedy still applies their processors (the sampler's
    shortcut for plain greedy steps is for steps without any)."""
    logits = torch.tensor([[5.0, 4.9, 0.0, -1.0]])
    params = [SamplingParams(temperature=0.0, presence_penalty=1.0)]
    state = LogitsState(1, 4, torch.device("cpu"))
    state.admit(0, "a", [1], [0], params[0])
    md = SamplingMetadata.from_params(params, [1])
    md.processors, _ = state.step_inputs(np.arange(1), ["a"], np.arange(1), params, [1],
                                         torch.zeros(1, dtype=torch.int64))
    assert md.all_greedy and md.processors is not None
    assert Sampler()(logits, md).sampled_token_ids.tolist() == [1]  # 5 - 1 < 4.9


def test_banned_ids_outside_the_vocabulary_are_ignored():
    """min_tokens' stop ids and one-token bad words may name ids past the model's vocabulary
    (a tokenizer's added tokens): they ban nothing, and the ids inside it are banned."""
    from cadence.worker.logits_processors import apply_banned_tokens

    logits = _logits(2, seed=6)
    got = logits.clone()
    apply_banned_tokens(got, {0: [V, V + 7, -1, 3], 1: [V - 1]})
    want = logits.clone()
    want[0, 3] = float("-inf")
    want[1, V - 1] = float("-inf")
    assert torch.equal(got, want)


def test_conditional_bans_leave_unmatched_rows_untouched_and_stack():
    """Two bad words ending in the same token, both waiting on the in-flight token: the ban
    holds when either prefix matched, and a row whose in-flight token matches neither keeps
    its logits exactly."""
    params = [SamplingParams(), SamplingParams(), SamplingParams()]
    for p in params:
        p.bad_words_token_ids = [[1, 2], [3, 2]]
    state = _state([[9]] * 3, [[]] * 3, params)
    last_sampled = torch.tensor([3, 5, 1])  # slots 0 and 2 match a prefix, slot 1 neither
    inputs, bans = state.step_inputs(np.arange(3), ["r0", "r1", "r2"], np.arange(3), params,
                                     [1, 1, 1], last_sampled)
    assert bans == {}
    logits = _logits(3, seed=7)
    got = logits.clone()
    apply_logits_processors(got, inputs, bans)
    assert torch.isinf(got[0, 2]) and torch.isinf(got[2, 2])
    assert torch.equal(got[1], logits[1])
    assert torch.equal(got[0, :2], logits[0, :2]) and torch.equal(got[0, 3:], logits[0, 3:])


def test_penalties_read_the_state_slot_not_the_logits_row():
    """Logits rows and state slots differ once the batch is condensed: row 0 is slot 2."""
    counts = TokenCounts(3, V, torch.device("cpu"))
    counts.reset(0, [], [])
    counts.reset(1, [], [])
    counts.reset(2, [], [4, 4])
    params = [SamplingParams(frequency_penalty=1.0), SamplingParams(frequency_penalty=1.0)]
    pen = penalty_rows(np.array([0, 1]), np.array([2, 0]), params, torch.device("cpu"))
    logits = _logits(2, seed=8)
    got = logits.clone()
    apply_penalties(got, pen, counts.counts, counts.prompt_mask)
    want = logits.clone()
    want[0, 4] -= 2.0
    torch.testing.assert_close(got, want)


def test_a_token_of_an_earlier_admission_is_not_recorded() -> None:
    """Under async scheduling a step's output is read after the next step ran: a request
    readmitted in between (preempted, or aborted and re-added) must not take the earlier
    admission's token into its history."""
    params = [SamplingParams(bad_words=["x"])]
    params[0].bad_words_token_ids = [[1, 2]]
    state = _state([[9]], [[]], params)
    before = state.wants("r0")
    state.admit(0, "r0", [9], [], params[0])  # readmitted: a new history
    state.record("r0", 0, 1, before)  # the old admission's token arrives late
    assert state.wants("r0") == [] and state.wants("r0") is not before
    state.record("r0", 0, 4, state.wants("r0"))
    assert state.wants("r0") == [4]
