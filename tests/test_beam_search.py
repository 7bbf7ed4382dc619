"""The beam search's bookkeeping on hand-made candidates (no engine): scores, what finishes,
what lives on, what is returned."""

from __future__ import annotations

import math

import pytest

from cadence.beam_search import BeamSearch, beam_score
from cadence.outputs import Logprob
from cadence.sampling_params import BeamSearchParams

EOS = 2


def row(**lps: float) -> dict[int, Logprob]:
    """Candidates as the engine returns them: token id -> Logprob (keys ``t<id>``)."""
    return {int(k[1:]): Logprob(v) for k, v in lps.items()}


def test_score_is_the_logprob_over_the_length_without_a_final_end_token() -> None:
    assert beam_score([5, 6, 7], -3.0, EOS) == -1.0
    assert beam_score([5, 6, EOS], -3.0, EOS) == -1.5  # the end token is not counted
    assert beam_score([5, 6, 7], -3.0, EOS, length_penalty=2.0) == pytest.approx(-3.0 / 9)
    assert beam_score([5, EOS], -3.0, None) == -1.5  # no end token: every token counts


@pytest.mark.parametrize(("penalty", "want"), [(1e308, 0.0), (-2000.0, -math.inf),
                                               (300.0, None), (-300.0, None)])
def test_extreme_length_penalties_rank_without_float_errors(penalty: float, want) -> None:
    """A penalty whose power leaves the float range ranks as infinitely long (score 0) or
    short (-inf) instead of raising: the search still returns its beams."""
    score = beam_score([5, 6, 7], -3.0, EOS, penalty)
    assert score == want if want is not None else -math.inf < score < 0
    search = BeamSearch([9] * 5, BeamSearchParams(beam_width=2, max_tokens=2,
                                                  length_penalty=penalty), EOS, 100)
    for _ in range(2):
        search.advance([row(t2=-0.5, t4=-0.2, t5=-0.3) for _ in search.pending()])
    assert len(search.best()) == 2


def test_two_steps_by_hand() -> None:
    search = BeamSearch([9], BeamSearchParams(beam_width=2, max_tokens=2), EOS, 100)
    assert [b.tokens for b in search.pending()] == [[9]]
    search.advance([row(t3=-0.1, t4=-0.5, t2=-1.0, t5=-2.0)])
    assert [b.tokens for b in search.beams] == [[9, 3], [9, 4]]  # 5 is third: dropped
    assert [(b.tokens, b.cum_logprob) for b in search.completed] == [([9, EOS], -1.0)]
    search.advance([row(t6=-3.0, t2=-0.2), row(t7=-0.3, t8=-0.4)])
    assert [b.tokens for b in search.beams] == [[9, 4, 7], [9, 4, 8]]
    assert search.done and search.pending() == []
    # Scores: [9, 2] -1.0 / 1; [9, 3, 2] -0.3 / 2 = -0.15; [9, 4, 7] -0.8 / 3; [9, 4, 8] -0.3.
    best = search.best()
    assert [b.tokens for b in best] == [[9, 3, EOS], [9, 4, 7]]
    assert [b.finish_reason for b in best] == ["stop", "length"]
    assert best[0].stop_reason == EOS and best[1].stop_reason is None
    assert best[0].cum_logprob == pytest.approx(-0.3)
    assert len(best[0].logprobs) == 2 and best[0].logprobs[1] == row(t6=-3.0, t2=-0.2)
    assert search.generated(best[0]) == [3] and search.generated(best[1]) == [4, 7]
    shown = BeamSearch([9], BeamSearchParams(beam_width=2, max_tokens=2,
                                             include_stop_str_in_output=True), EOS, 100)
    assert shown.generated(best[0]) == [3, EOS]


def test_finished_beams_are_kept_to_the_width() -> None:
    """Every step finishes candidates: only the best beam_width of them are kept (the answer
    cannot take others), and the answer is what ranking all of them would give."""
    search = BeamSearch([9], BeamSearchParams(beam_width=2, max_tokens=6), EOS, 100)
    finished = []  # every finished candidate, as an unbounded search would keep it
    for step in range(6):
        beams = search.pending()
        rows = [row(t2=-0.5 - 0.1 * step - 0.01 * i, t4=-0.2, t5=-0.3)
                for i, _ in enumerate(beams)]
        for b, r in zip(beams, rows):
            finished.append((b.tokens + [EOS], b.cum_logprob + r[EOS].logprob))
        search.advance(rows)
        assert len(search.completed) <= 2
    live = [(b.tokens, b.cum_logprob) for b in search.beams]
    everything = sorted(finished + live, key=lambda s: beam_score(s[0], s[1], EOS), reverse=True)
    assert [b.tokens for b in search.best()] == [t for t, _ in everything[:2]]


def test_ignore_eos_keeps_the_end_token_in_the_race() -> None:
    search = BeamSearch([9], BeamSearchParams(beam_width=2, max_tokens=1, ignore_eos=True),
                        EOS, 100)
    search.pending()
    search.advance([row(t2=-0.1, t4=-0.5, t5=-0.7)])
    assert search.completed == []
    assert [b.tokens for b in search.best()] == [[9, EOS], [9, 4]]


def test_length_penalty_ranks_longer_answers_higher() -> None:
    """A finished short beam against a longer live one: the penalty decides."""
    def run(penalty: float) -> list[int]:
        search = BeamSearch([9, 9], BeamSearchParams(beam_width=1, max_tokens=3,
                                                     length_penalty=penalty), EOS, 100)
        for _ in range(3):
            search.pending()
            search.advance([row(t2=-1.0, t4=-0.6)])
        return search.best()[0].tokens

    # [9, 9, 2]: -1.0 / 2 ** p; [9, 9, 4, 4, 4]: -1.8 / 5 ** p.
    assert run(1.0) == [9, 9, 4, 4, 4]  # -0.5 against -0.36
    assert run(0.0) == [9, 9, EOS]  # -1.0 against -1.8


def test_a_missing_row_and_the_context_end() -> None:
    search = BeamSearch([9], BeamSearchParams(beam_width=2, max_tokens=5), EOS, max_model_len=3)
    search.pending()
    search.advance([row(t3=-0.1, t4=-0.2)])
    search.pending()
    search.advance([None, row(t5=-0.3, t6=-0.4)])  # the first beam got no candidates
    assert [b.tokens for b in search.beams] == [[9, 4, 5], [9, 4, 6]]
    assert search.pending() == []  # three tokens fill a context of three
    assert search.done
    assert [b.finish_reason for b in search.best()] == ["length", "length"]


@pytest.mark.parametrize(("fields", "fragment"), [
    ({"beam_width": 0}, "beam_width"),
    ({"beam_width": True}, "beam_width"),
    ({"beam_width": 1.5}, "beam_width"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"length_penalty": math.inf}, "length_penalty"),
    ({"ignore_eos": 1}, "ignore_eos"),
])
def test_params_are_checked(fields: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        BeamSearchParams(**{"beam_width": 2, "max_tokens": 4, **fields})


def test_each_step_asks_for_twice_the_width() -> None:
    params = BeamSearchParams(beam_width=3, max_tokens=4, temperature=0.5)
    step = params.step_params()
    assert (step.logprobs, step.max_tokens, step.temperature, step.detokenize) == (6, 1, 0.5,
                                                                                    False)
