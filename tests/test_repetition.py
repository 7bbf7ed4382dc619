"""Repetition detection (vLLM's ``repetition_detection``): the incremental check against the
rule written out here, token by token, on outputs built to repeat and on random ones."""

from __future__ import annotations

import random

import pytest

from cadence.repetition import RepetitionDetectionParams, RepetitionTracker
from cadence.sampling_params import SamplingParams


def repeats(tokens: list[int], low: int, high: int, count: int) -> bool:
    """The rule: for some L in low..high the last L * count tokens are ``count`` copies of the
    last L tokens."""
    for size in range(max(low, 1), high + 1):
        span = size * count
        if span <= len(tokens) and tokens[-span:] == tokens[-size:] * count:
            return True
    return False


def first_detection(tokens: list[int], low: int, high: int, count: int) -> int | None:
    for end in range(1, len(tokens) + 1):
        if repeats(tokens[:end], low, high, count):
            return end
    return None


def _outputs(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    made = []
    for _ in range(40):
        vocab = rng.choice([2, 3, 5, 50])
        tokens: list[int] = []
        while len(tokens) < 120:
            if rng.random() < 0.3:  # a run of one pattern
                pattern = [rng.randrange(vocab) for _ in range(rng.randint(1, 9))]
                tokens += pattern * rng.randint(1, 5) + pattern[: rng.randrange(len(pattern))]
            else:
                tokens.append(rng.randrange(vocab))
        made.append(tokens)
    return made


@pytest.mark.parametrize(("low", "high", "count"), [(0, 1, 2), (1, 4, 3), (3, 8, 2), (2, 2, 4),
                                                    (0, 20, 3), (5, 9, 5)])
def test_the_tracker_fires_where_the_rule_first_holds(low: int, high: int, count: int) -> None:
    params = RepetitionDetectionParams(max_pattern_size=high, min_pattern_size=low,
                                       min_count=count)
    fired = 0
    for tokens in _outputs(seed=high * 100 + count):
        tracker = RepetitionTracker(params)
        got = next((end for end in range(1, len(tokens) + 1)
                    if tracker.repeats(tokens[:end])), None)
        assert got == first_detection(tokens, low, high, count), tokens
        fired += got is not None
    assert fired > 0  # the outputs do repeat


def test_tokens_fed_in_steps_of_several_match_one_by_one() -> None:
    params = RepetitionDetectionParams(max_pattern_size=6, min_pattern_size=2, min_count=3)
    for tokens in _outputs(seed=7):
        whole = RepetitionTracker(params)
        for end in range(5, len(tokens) + 1, 5):  # as a min_tokens deferral feeds them
            assert whole.repeats(tokens[:end]) == repeats(tokens[:end], 2, 6, 3)


@pytest.mark.parametrize(("fields", "message"), [
    ({"max_pattern_size": -1}, "min_pattern_size <= max_pattern_size"),
    ({"max_pattern_size": 3, "min_pattern_size": 4, "min_count": 2}, "min_pattern_size <="),
    ({"max_pattern_size": 3, "min_count": 1}, "min_count must be >= 2"),
    ({"max_pattern_size": 3.0, "min_count": 2}, "must be an integer"),
    ({"max_pattern_size": True, "min_count": 2}, "must be an integer"),
    ({"max_pattern_size": 5000, "min_count": 2}, "at most"),
    ({"max_pattern_size": 5, "min_count": 10**6}, "at most"),
])
def test_bad_parameters_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RepetitionDetectionParams(**fields)
    with pytest.raises(ValueError, match="repetition_detection"):
        SamplingParams(repetition_detection=fields)


def test_sampling_params_take_a_dict_and_refuse_other_types() -> None:
    p = SamplingParams(repetition_detection={"max_pattern_size": 4, "min_count": 2})
    assert p.repetition_detection == RepetitionDetectionParams(4, 0, 2)
    assert p.clone().repetition_detection is not p.repetition_detection
    with pytest.raises(ValueError, match="unexpected keyword"):
        SamplingParams(repetition_detection={"max_pattern": 4})
    with pytest.raises(ValueError, match="RepetitionDetectionParams or a dict"):
        SamplingParams(repetition_detection=[4, 0, 2])
    assert not SamplingParams(repetition_detection={}).repetition_detection.enabled


def test_fields_set_after_construction_are_checked_again() -> None:
    """The engine takes a request's parameters through ``verified()``: a detection set up
    wrongly after construction is refused there, as in the constructor."""
    p = SamplingParams(repetition_detection=RepetitionDetectionParams())
    p.repetition_detection.max_pattern_size = 8  # min_count stays 0
    with pytest.raises(ValueError, match="min_count must be >= 2"):
        p.verified()
    p.repetition_detection.min_count, p.repetition_detection.max_pattern_size = 2, 10**6
    with pytest.raises(ValueError, match="at most"):
        p.verified()


def test_the_context_limit_comes_before_repetition() -> None:
    """vLLM's order: a token that fills the context ends the request with "length" even where
    it also completes a repetition."""
    from cadence.scheduler.request import Request, RequestStatus
    from cadence.scheduler.stop import append_until_stop

    params = SamplingParams(max_tokens=10, ignore_eos=True,
                            repetition_detection={"max_pattern_size": 1, "min_count": 3})
    request = Request("r", [1, 2, 3], params)
    _, stopped = append_until_stop(request, [7, 7, 7], max_model_len=6)
    assert stopped and request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    request = Request("s", [1, 2, 3], params)
    _, stopped = append_until_stop(request, [7, 7, 7], max_model_len=7)
    assert stopped and request.status == RequestStatus.FINISHED_REPETITION
