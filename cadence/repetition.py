"""Ending a request whose output repeats itself (vLLM's ``repetition_detection``).

A request with ``RepetitionDetectionParams(max_pattern_size=M, min_pattern_size=m,
min_count=c)`` finishes with reason ``"repetition"`` (stop reason ``"repetition_detected"``) at
the first output token after which, for some pattern length L in m..M, the last L tokens are
the same as each of the c - 1 runs of L tokens before them: the output ends with a pattern
seen c times in a row. ``min_tokens`` defers the check as it defers the other stops.

``RepetitionTracker`` checks that in time independent of the output's length: for every L it
keeps how many of the latest tokens equal the token L places before them (only the nonzero
counts, which grow where the new token occurred L places back and drop to 0 elsewhere), and the
output ends with c copies of an L-token pattern exactly when that count reaches L * (c - 1).
A token costs one step per place it occurred among the last M tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from cadence.field_checks import is_int

__all__ = ["MAX_PATTERN_SIZE", "MAX_MIN_COUNT", "RepetitionDetectionParams", "RepetitionTracker"]

# Bounds a request may ask for (vLLM silently skips the check past its own bound; here such a
# request is refused, so that a client knows its check is not done).
MAX_PATTERN_SIZE = 1024
MAX_MIN_COUNT = 1024


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
            if not is_int(value):
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
        self._low = max(params.min_pattern_size, 1)
        self._high = params.max_pattern_size
        self._copies = params.min_count - 1
        # For each L in low..high with a nonzero count: how many of the latest tokens equal the
        # token L places before them.
        self._runs: dict[int, int] = {}
        # Where each token occurred among the last ``high`` tokens (oldest first).
        self._places: dict[int, deque[int]] = {}
        self._seen = 0

    def repeats(self, output_token_ids: list[int]) -> bool:
        """Take the tokens added since the last call; whether the output now ends with a
        pattern repeated as the parameters ask."""
        low, high = self._low, self._high
        for pos in range(self._seen, len(output_token_ids)):
            token = output_token_ids[pos]
            places = self._places.get(token)
            if places is None:
                places = self._places[token] = deque()
            while places and pos - places[0] > high:
                places.popleft()
            runs = self._runs
            self._runs = {pos - p: runs.get(pos - p, 0) + 1 for p in places if pos - p >= low}
            places.append(pos)
        self._seen = len(output_token_ids)
        copies = self._copies
        return any(run >= size * copies for size, run in self._runs.items())
