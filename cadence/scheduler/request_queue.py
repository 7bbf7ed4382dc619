"""Waiting queues: first-come-first-served and priority (vLLM v1 ``request_queue.py``)."""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Iterator

from cadence.config import SCHEDULING_POLICIES
from cadence.scheduler.request import Request


class RequestQueue(ABC):
    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Add a request in the order of the policy."""

    @abstractmethod
    def pop_request(self) -> Request:
        """Remove and return the next request to serve."""

    @abstractmethod
    def peek_request(self) -> Request:
        """Return the next request to serve without removing it."""

    @abstractmethod
    def prepend_request(self, request: Request) -> None:
        """Put a request back in front (FCFS); the priority queue orders it like any other."""

    @abstractmethod
    def prepend_requests(self, requests: RequestQueue) -> None:
        """Put every request of ``requests`` back in front, keeping their relative order."""

    @abstractmethod
    def remove_request(self, request: Request) -> None: ...

    @abstractmethod
    def remove_requests(self, requests: Iterable[Request]) -> None: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """Requests in service order."""

    def __bool__(self) -> bool:
        return len(self) > 0


class FCFSRequestQueue(RequestQueue):
    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._queue.append(request)

    def pop_request(self) -> Request:
        return self._queue.popleft()

    def peek_request(self) -> Request:
        if not self._queue:
            raise IndexError("peek from an empty queue")
        return self._queue[0]

    def prepend_request(self, request: Request) -> None:
        self._queue.appendleft(request)

    def prepend_requests(self, requests: RequestQueue) -> None:
        self._queue.extendleft(reversed(list(requests)))

    def remove_request(self, request: Request) -> None:
        self._queue.remove(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        to_remove = requests if isinstance(requests, (set, frozenset)) else set(requests)
        if len(to_remove) == 1:
            self._queue.remove(next(iter(to_remove)))
            return
        self._queue = deque(r for r in self._queue if r not in to_remove)

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)

    def __getitem__(self, index: int) -> Request:
        return self._queue[index]


class PriorityRequestQueue(RequestQueue):
    """Min-heap by ``(priority, arrival_time, request_id)``: a lower priority value is served
    first, ties go to the earlier arrival."""

    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, request)

    def pop_request(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty queue")
        return heapq.heappop(self._heap)

    def peek_request(self) -> Request:
        if not self._heap:
            raise IndexError("peek from an empty queue")
        return self._heap[0]

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)

    def prepend_requests(self, requests: RequestQueue) -> None:
        for request in requests:
            self.add_request(request)

    def remove_request(self, request: Request) -> None:
        self._heap.remove(request)
        heapq.heapify(self._heap)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        to_remove = requests if isinstance(requests, (set, frozenset)) else set(requests)
        self._heap = [r for r in self._heap if r not in to_remove]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted(self._heap))


def create_request_queue(policy: str) -> RequestQueue:
    if policy == "fcfs":
        return FCFSRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {policy!r}.")
