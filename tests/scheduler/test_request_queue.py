"""FCFS and priority waiting queues."""

from __future__ import annotations

import pytest

from cadence.scheduler.request_queue import (
    FCFSRequestQueue,
    PriorityRequestQueue,
    create_request_queue,
)
from tests.scheduler.factories import create_requests


def _ids(queue) -> list[str]:
    return [r.request_id for r in queue]


def test_fcfs_order_prepend_and_remove():
    a, b, c, d = create_requests(4)
    queue = create_request_queue("fcfs")
    assert isinstance(queue, FCFSRequestQueue) and not queue
    for r in (a, b, c):
        queue.add_request(r)
    assert queue.peek_request() is a and len(queue) == 3
    assert queue.pop_request() is a
    queue.prepend_request(d)
    assert _ids(queue) == ["3", "1", "2"]
    other = FCFSRequestQueue()
    other.add_request(a)
    other.add_request(b)
    queue.remove_request(b)
    queue.prepend_requests(other)
    assert _ids(queue) == ["0", "1", "3", "2"]
    queue.remove_requests([a, c])
    assert _ids(queue) == ["1", "3"]
    queue.remove_requests({d})
    assert _ids(queue) == ["1"] and queue[0] is b


def test_priority_order_is_priority_then_arrival_then_id():
    reqs = create_requests(5, priorities=[2, 0, 1, 0, 1], arrival_times=[1.0, 3.0, 2.0, 3.0, 0.5])
    queue = create_request_queue("priority")
    assert isinstance(queue, PriorityRequestQueue)
    for r in reqs:
        queue.add_request(r)
    # (0, 3.0, "1") < (0, 3.0, "3") < (1, 0.5, "4") < (1, 2.0, "2") < (2, 1.0, "0")
    assert _ids(queue) == ["1", "3", "4", "2", "0"]
    assert len(queue) == 5  # iteration does not consume
    assert queue.peek_request().request_id == "1"
    assert queue.pop_request().request_id == "1"
    # "Prepending" a request puts it in its priority place, not at the front.
    queue.prepend_request(reqs[1])
    assert _ids(queue) == ["1", "3", "4", "2", "0"]
    queue.remove_request(reqs[4])
    queue.remove_requests([reqs[1], reqs[0]])
    assert _ids(queue) == ["3", "2"]
    other = PriorityRequestQueue()
    other.add_request(reqs[0])
    queue.prepend_requests(other)
    assert [queue.pop_request().request_id for _ in range(3)] == ["3", "2", "0"]
    with pytest.raises(IndexError):
        queue.pop_request()
    with pytest.raises(IndexError):
        queue.peek_request()



def test_priority_prepend_of_a_less_urgent_request_keeps_the_order() -> None:
    """A preempted request put back into the priority queue goes to its priority's place: the
    queue still serves the most urgent first."""
    reqs = create_requests(4, priorities=[0, 1, 2, 3], arrival_times=[0.0, 1.0, 2.0, 3.0])
    queue = PriorityRequestQueue()
    for r in reqs[:3]:
        queue.add_request(r)
    queue.prepend_request(reqs[3])
    assert queue.peek_request() is reqs[0]
    assert [queue.pop_request().request_id for _ in range(4)] == ["0", "1", "2", "3"]


def test_unknown_policy_is_an_error():
    with pytest.raises(ValueError, match="scheduling_policy"):
        create_request_queue("sjf")


@pytest.mark.parametrize("seed", range(5))
def test_priority_queue_pops_in_order_after_any_removal(seed: int) -> None:
    """Removing waiting requests (aborts) from anywhere in the heap, the root first, one at a
    time or several at once, leaves the rest popping in priority order."""
    import random

    rng = random.Random(seed)
    n = 24
    reqs = create_requests(n, priorities=[rng.randrange(4) for _ in range(n)],
                           arrival_times=[rng.random() for _ in range(n)])
    key = {r.request_id: (r.priority, r.arrival_time, r.request_id) for r in reqs}
    queue = create_request_queue("priority")
    for r in reqs:
        queue.add_request(r)
    removed = [queue.peek_request()]
    queue.remove_request(removed[0])  # the root
    one = rng.choice(list(queue))
    queue.remove_request(one)
    popped = [queue.pop_request().request_id for _ in range(4)]  # before any other change
    several = rng.sample(list(queue), 3)
    queue.remove_requests(several)
    popped += [queue.pop_request().request_id for _ in range(len(queue))]
    gone = {r.request_id for r in [*removed, one, *several]}
    assert popped == sorted(popped, key=key.__getitem__)
    assert len(popped) == n - 5 and not gone & set(popped)
