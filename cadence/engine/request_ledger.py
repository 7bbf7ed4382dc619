"""The front end's book of requests between states that the output processor does not see:
ids still being prepared (validated, tokenized) whose abort must wait until they are added, and
ids ended here (aborted, or finished by a stop string) whose end the core has not reported yet,
so that a new request reusing such an id waits instead of receiving their last tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

__all__ = ["RequestLedger"]


class RequestLedger:
    """Preparing and draining request ids of one ``AsyncLLM`` (its event loop's thread only)."""

    def __init__(self) -> None:
        self.preparing: dict[str, int] = {}  # id -> how many of its adds are being prepared
        self.aborted_early: set[str] = set()  # of those, the ids aborted meanwhile
        self.draining: dict[str, asyncio.Event] = {}

    # -- preparing ----------------------------------------------------------------------------
    def begin_preparing(self, request_id: str) -> None:
        self.preparing[request_id] = self.preparing.get(request_id, 0) + 1

    def end_preparing(self, request_id: str) -> bool:
        """One add of ``request_id`` is prepared (or failed); True when it was the last one
        and the id was aborted meanwhile: the caller applies the abort now."""
        left = self.preparing.pop(request_id) - 1
        if left:
            self.preparing[request_id] = left
            return False
        if request_id in self.aborted_early:
            self.aborted_early.discard(request_id)
            return True
        return False

    def note_aborts(self, request_ids: Iterable[str]) -> None:
        self.aborted_early.update(r for r in request_ids if r in self.preparing)

    # -- draining -----------------------------------------------------------------------------
    def start_draining(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self.draining.setdefault(request_id, asyncio.Event())

    def stop_draining(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            event = self.draining.pop(request_id, None)
            if event is not None:
                event.set()

    def stop_all_draining(self) -> None:
        self.stop_draining(list(self.draining))

    def draining_event(self, request_id: str) -> asyncio.Event | None:
        return self.draining.get(request_id)
