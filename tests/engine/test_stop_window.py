"""Stop strings are searched in the new text plus a lookback of the longest stop string, never
in the whole output (the per-token cost must not grow with the output), with the same result as
a search of the whole text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cadence.engine.detokenizer import find_stop_string


class RecordingText(str):
    """A str that records where each ``find`` starts."""

    starts: list[tuple[str, int]]

    def find(self, sub, start=None, end=None):  # type: ignore[override]
        self.starts.append((sub, 0 if start is None else start))
        return str.find(self, sub, start, end)


def test_search_starts_within_the_lookback() -> None:
    text = RecordingText("x" * 100_000 + "abc stop here")
    text.starts = []
    stops = ["stop", "a much longer stop string", "zz"]
    found = find_stop_string(text, 9, stops, include_in_output=False)
    assert found == ("stop", 100_004)
    for sub, start in text.starts:
        assert start >= len(text) - 9 - (len(sub) - 1)


def _reference(text: str, new: int, stops: list[str], include: bool) -> tuple[str, int] | None:
    """The first listed stop string with a match that overlaps the new text, anywhere in the
    whole text (vLLM's order), at its first such match."""
    for s in stops:
        for i in range(len(text) - len(s) + 1):
            if text.startswith(s, i) and i + len(s) > len(text) - new:
                if include:
                    return s, (-1 if i + len(s) >= len(text) else i + len(s))
                return s, i
    return None


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(
    text=st.text(alphabet="ab ", max_size=40),
    new=st.integers(min_value=0, max_value=40),
    stops=st.lists(st.text(alphabet="ab ", min_size=1, max_size=5), max_size=4),
    include=st.booleans(),
)
def test_same_result_as_searching_everything(text, new, stops, include) -> None:
    new = min(new, len(text))
    expected = _reference(text, new, stops, include) if new > 0 and stops else None
    assert find_stop_string(text, new, stops, include) == expected
