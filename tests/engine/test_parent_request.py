"""ParentRequest (n > 1): its metrics' count of choices ended and the most tokens one of them
generated (vLLM's ``max_num_generation_tokens``: the largest over the n, whatever the order in
which they end)."""

from __future__ import annotations

from cadence.core_types import EngineCoreRequest
from cadence.engine.parent_request import ParentRequest
from cadence.sampling_params import SamplingParams


def test_the_most_tokens_of_any_choice_whichever_ends_last() -> None:
    parent = ParentRequest(EngineCoreRequest("p", [5, 6], SamplingParams(n=3, temperature=1.0)))
    assert parent.observe_finished(2) is None
    assert parent.observe_finished(5) is None
    assert parent.observe_finished(1) == 5  # the last to end generated fewer than another
