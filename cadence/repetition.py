"""Ending a request whose output repeats itself (vLLM's ``repetition_detection``).

A request with ``RepetitionDetectionParams(max_pattern_size=M, min_pattern_size=m,
min_count=c)`` finishes with reason ``"repetition"`` (stop reason ``"repetition_detected"``) at
the first output token after which, for some pattern length L in m..M, the last L tokens are
the same as each of the c - 1 runs of L tokens before them: the output ends with a pattern
seen c times in a row. ``min_tokens`` defers the check as it defers the other stops.

``RepetitionTracker`` checks that in time independent of the output's length: for every L it
keeps how many of the latest tokens equal the token L places before them, and the output ends
with c copies of an L-token pattern exactly when that count reaches L * (c - 1).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_PATTERN_SIZE", "MAX_MIN_COUNT", "RepetitionDetectionParams", "RepetitionTracker"]

# Bounds a request may ask for (vLLM silently skips the check past its own bound; here such a
# request is refused, so that a client knows its check is not done).
MAX_PATTERN_SIZE = 4096
MAX_MIN_COUNT = 4096


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass
class RepetitionDetectionParams:
    """vLLM's parameters: patterns of ``min_pattern_size`` (0: 1) to ``max_pattern_size`` tokens
    (0: no check) seen ``min_count`` times in a row (at least 2 when checking) end the
    request."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    def __post_init__(self) -> None:
        for name in ("max_pattern_size", "min_pattern_size", "min_count"):
            value = getattr(self, name)
            if not _is_int(value):
                raise ValueError(f"repetition_detection: {name} must be an integer, got "
                                 f"{value!r}.")
            setattr(self, name, int(value))
        if (self.max_pattern_size < 0 or self.min_pattern_size < 0
                or self.min_pattern_size > self.max_pattern_size):
            raise ValueError("repetition_detection: max_pattern_size and min_pattern_size must "
                             "be >= 0, with min_pattern_size <= max_pattern_size (both 0: no "
                             "check).")
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise ValueError("repetition_detection: min_count must be >= 2 when "
                             f"max_pattern_size is set, got {self.min_count}.")
        if self.max_pattern_size > MAX_PATTERN_SIZE or self.min_count > MAX_MIN_COUNT:
            raise ValueError(f"repetition_detection: max_pattern_size and min_count must be at "
                             f"most {MAX_PATTERN_SIZE} and {MAX_MIN_COUNT}.")

    @property
    def enabled(self) -> bool:
        return self.max_pattern_size > 0


class RepetitionTracker:
    """One request's check, fed its output tokens as they come (``repeats``)."""

    def __init__(self, params: RepetitionDetectionParams) -> None:
        low = max(params.min_pattern_size, 1)
        self._periods = np.arange(low, params.max_pattern_size + 1, dtype=np.int64)
        # Tokens equal to the one L places before, for a pattern of L seen min_count times.
        self._needed = self._periods * (params.min_count - 1)
        self._run = np.zeros_like(self._periods)
        self._tokens = np.empty(64, dtype=np.int64)
        self._seen = 0

    def repeats(self, output_token_ids: list[int]) -> bool:
        """Take the tokens added since the last call; whether the output now ends with a
        pattern repeated as the parameters ask."""
        periods, run = self._periods, self._run
        for token in output_token_ids[self._seen:]:
            pos = self._seen
            if pos == len(self._tokens):
                self._tokens = np.resize(self._tokens, 2 * pos)
            self._tokens[pos] = token
            earlier = pos - periods
            same = (earlier >= 0) & (self._tokens[np.maximum(earlier, 0)] == token)
            run = np.where(same, run + 1, 0)
            self._seen = pos + 1
        self._run = run
        return bool((run >= self._needed).any())
