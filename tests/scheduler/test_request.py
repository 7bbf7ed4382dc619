"""The scheduler's Request: finished states and their reasons (vLLM v1's mapping), the priority
heap order, and token lists that belong to the request alone."""

from __future__ import annotations

import heapq

import pytest

from cadence.core_types import FinishReason
from cadence.sampling_params import SamplingParams
from cadence.scheduler.request import Request, RequestStatus


def make(rid: str, prompt: list[int] | None = None, **kw: object) -> Request:
    return Request(rid, prompt if prompt is not None else [1, 2, 3], SamplingParams(), **kw)


@pytest.mark.parametrize(("status", "reason"), [
    (RequestStatus.WAITING, None),
    (RequestStatus.RUNNING, None),
    (RequestStatus.PREEMPTED, None),
    (RequestStatus.FINISHED_STOPPED, FinishReason.STOP),
    (RequestStatus.FINISHED_LENGTH_CAPPED, FinishReason.LENGTH),
    (RequestStatus.FINISHED_ABORTED, FinishReason.ABORT),
    # vLLM: an ignored request (a prompt too long to ever run) reports "length".
    (RequestStatus.FINISHED_IGNORED, FinishReason.LENGTH),
    (RequestStatus.FINISHED_ERROR, FinishReason.ERROR),
])
def test_finished_states_and_their_reasons(status: RequestStatus,
                                           reason: FinishReason | None) -> None:
    req = make("r")
    req.status = status
    assert req.is_finished() is (reason is not None)
    assert req.get_finished_reason() == reason


def test_priority_order_is_priority_then_arrival_then_request_id() -> None:
    a = make("a", priority=1, arrival_time=5.0)
    b = make("b", priority=1, arrival_time=5.0)
    early = make("z", priority=1, arrival_time=4.0)
    urgent = make("y", priority=0, arrival_time=9.0)
    assert a < b and not b < a  # full tie: the request id decides
    heap: list[Request] = []
    for r in (b, a, early, urgent):
        heapq.heappush(heap, r)
    assert [heapq.heappop(heap).request_id for _ in range(4)] == ["y", "z", "a", "b"]


def test_token_lists_belong_to_the_request() -> None:
    prompt = [1, 2, 3]
    req = make("r", prompt)
    prompt.append(99)  # the caller reuses its list
    req.append_output_token_ids(7)
    req.append_output_token_ids([8, 9])
    assert req.prompt_token_ids == [1, 2, 3] and req.num_prompt_tokens == 3
    assert req.output_token_ids == [7, 8, 9]
    assert req.all_token_ids == [1, 2, 3, 7, 8, 9] and req.num_tokens == 6
    assert prompt == [1, 2, 3, 99]
