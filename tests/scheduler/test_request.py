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
    (RequestStatus.FINISHED_REPETITION, FinishReason.REPETITION),
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


def test_an_arrival_time_of_zero_is_kept() -> None:
    # 0.0 is a time like any other (a trace's first request): not "no time given".
    first = make("b", arrival_time=0.0)
    later = make("a", arrival_time=1.0)
    assert first.arrival_time == 0.0
    assert first < later and not later < first


def test_a_new_request_has_no_prefix_cache_count_yet() -> None:
    # vLLM: num_cached_tokens is -1 until the request is first scheduled.
    req = make("r")
    assert req.num_cached_tokens == -1
    assert req.num_computed_tokens == 0 and req.num_output_tokens == 0


def test_waiting_for_grammar_until_it_compiles_then_never_asks_again() -> None:
    ready = [False]
    calls = []

    def grammar_ready() -> bool:
        calls.append(ready[0])
        return ready[0]

    req = make("r", grammar_ready=grammar_ready)
    assert req.waiting_for_grammar and req.waiting_for_grammar  # still compiling
    ready[0] = True
    assert not req.waiting_for_grammar
    assert not req.waiting_for_grammar  # remembered: no further call
    assert calls == [False, False, True]
    assert not make("plain").waiting_for_grammar


def test_hash_blocks_extends_the_list_to_the_blocks_asked_for() -> None:
    asked: list[int | None] = []

    def hasher(req: Request, known: list[bytes], num_blocks: int | None) -> list[bytes]:
        asked.append(num_blocks)
        # One hash per block of 2 tokens, up to num_blocks (every full block when None).
        full = req.num_tokens // 2
        upto = full if num_blocks is None else min(num_blocks, full)
        return [bytes([i]) for i in range(len(known), upto)]

    req = make("r", [1, 2, 3, 4, 5, 6, 7], block_hasher=hasher)
    assert req.hash_blocks(2) == [b"\x00", b"\x01"]
    assert req.hash_blocks(1) == [b"\x00", b"\x01"]  # already there: no call
    assert asked == [2]
    assert req.hash_blocks(3) == [b"\x00", b"\x01", b"\x02"]
    req.append_output_token_ids(8)
    assert req.block_hashes == [b"\x00", b"\x01", b"\x02", b"\x03"]
    assert asked == [2, 3, None]
