"""The server's request lifecycle: taking requests, draining them, and ending those left over.

On shutdown the server stops taking generation requests (503, ``Connection: close``), lets the
ones in flight run until they finish or the shutdown timeout passes, and then sets ``stop``: each
remaining response ends itself with an error (an SSE error event and ``[DONE]``, or a 503 JSON
body). ``InFlightMiddleware`` counts the requests from their first byte to their last.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from starlette.types import ASGIApp, Receive, Scope, Send

from cadence.server.errors import ServiceUnavailableError
from cadence.server.middleware import route_path

__all__ = ["GENERATION_PATHS", "InFlightMiddleware", "RequestLifecycle", "shutting_down_error"]

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses"})


def shutting_down_error(detail: str = "") -> ServiceUnavailableError:
    return ServiceUnavailableError(
        f"The server is shutting down{detail}.", None, headers={"connection": "close"}
    )


class RequestLifecycle:
    """Whether new generation requests are taken, and how many are in flight.

    Used from the event loop's thread only.
    """

    def __init__(self) -> None:
        self._accepting = True
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        # Set when the requests still in flight must end now (with an error).
        self.stop = asyncio.Event()

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def stop_accepting(self) -> None:
        self._accepting = False

    def end_in_flight(self) -> None:
        """Make every request still in flight end now, with an error."""
        self._accepting = False
        self.stop.set()

    async def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no request is in flight; False if ``timeout`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()


class InFlightMiddleware:
    """Counts generation requests while they run; refuses new ones once the server drains."""

    def __init__(self, app: ASGIApp, lifecycle: RequestLifecycle) -> None:
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or route_path(scope) not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        if not self.lifecycle.accepting:
            await shutting_down_error().response()(scope, receive, send)
            return
        with self.lifecycle.track():
            await self.app(scope, receive, send)
