"""uvicorn's h11 connection protocol with read deadlines.

uvicorn closes idle kept-alive connections (``timeout_keep_alive``) but has no deadline for a
request that is being received: a client that opens a connection and sends its headers a byte at
a time (slowloris), or stops sending, holds the connection for ever. Here:

- the request headers must be complete within ``header_read_timeout`` of the connection's
  opening (or, on a kept-alive connection, of the request's first byte); otherwise the server
  answers 408 (when part of a request came) and closes;
- a request body the application does not read (it answered already, e.g. 413 before reading)
  must still end within ``body_read_timeout``, or the connection is closed. A body the
  application reads is under the application's own deadline (``request_body.read_body``).
"""

from __future__ import annotations

from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from cadence.server.read_deadlines import ReadDeadlines

__all__ = ["TimedH11Protocol", "timed_h11_protocol"]


class TimedH11Protocol(ReadDeadlines, H11Protocol):
    def connection_made(self, transport: Any) -> None:
        self._init_deadlines()
        super().connection_made(transport)
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and self._read_phase is None:
            self._arm("headers")  # the first bytes of a request on a kept-alive connection
        super().data_received(data)
        self._follow_state()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request
        self._follow_state()

    def timeout_keep_alive_handler(self) -> None:
        # NOTE: a pipelined request partly received is not an idle connection: its header
        # deadline answers it (408), rather than uvicorn's keep-alive timer closing silently.
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            return
        super().timeout_keep_alive_handler()

    # -- deadlines ---------------------------------------------------------------------------
    def _follow_state(self) -> None:
        state = self.conn.their_state
        if state is h11.IDLE:
            if self._read_phase == "body":
                self._disarm()
            if self._read_phase is None and self.conn.trailing_data[0]:
                self._arm("headers")  # a pipelined request, partly received
        elif state is h11.SEND_BODY:
            if self._read_phase != "body":
                self._arm("body")
        else:
            self._disarm()

    def timeout_action(self, phase: str) -> str:
        if phase == "headers":
            if self.conn.their_state is not h11.IDLE:
                return "ignore"
            return "answer" if self.conn.trailing_data[0] else "close"
        if self.conn.their_state is not h11.SEND_BODY:
            return "ignore"
        if self.cycle is not None and not self.cycle.response_complete:
            return "rearm"
        return "close"


def timed_h11_protocol(header_read_timeout: float, body_read_timeout: float) -> type[H11Protocol]:
    """A ``TimedH11Protocol`` class with these deadlines (uvicorn's ``Config(http=...)``)."""
    return type(
        "ConfiguredTimedH11Protocol",
        (TimedH11Protocol,),
        {"header_read_timeout": header_read_timeout, "body_read_timeout": body_read_timeout},
    )

