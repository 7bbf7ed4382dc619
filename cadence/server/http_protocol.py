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

import asyncio
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from cadence.server.errors import RequestTimeoutError

__all__ = ["TimedH11Protocol", "http_protocol", "httptools_available", "timed_h11_protocol"]

logger = logging.getLogger(__name__)


def _timeout_response(timeout: float) -> bytes:
    err = RequestTimeoutError(f"The request headers were not received within {timeout:g} s.")
    body = json.dumps(err.body()).encode("ascii")
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class TimedH11Protocol(H11Protocol):
    header_read_timeout: float = 20.0
    body_read_timeout: float = 60.0

    def connection_made(self, transport: Any) -> None:
        self._read_timer: asyncio.TimerHandle | None = None
        self._read_phase: str | None = None
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

    def _arm(self, phase: str) -> None:
        self._disarm()
        timeout = self.header_read_timeout if phase == "headers" else self.body_read_timeout
        self._read_phase = phase
        self._read_timer = self.loop.call_later(timeout, self._on_timeout, phase)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer = None
        self._read_phase = None

    def _on_timeout(self, phase: str) -> None:
        self._read_timer = None
        self._read_phase = None
        if self.transport.is_closing():
            return
        peer = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        if phase == "headers":
            if self.conn.their_state is not h11.IDLE:
                return
            if self.conn.trailing_data[0]:
                logger.info(
                    "Closed the connection of %s: request headers incomplete after %g s.",
                    peer,
                    self.header_read_timeout,
                )
                self.transport.write(_timeout_response(self.header_read_timeout))
            else:
                logger.debug("Closed the idle connection of %s.", peer)
            self.transport.close()
            return
        if self.conn.their_state is not h11.SEND_BODY:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm("body")  # the application reads this body and answers its timeout
            return
        logger.info(
            "Closed the connection of %s: the rest of a request body did not come within %g s.",
            peer,
            self.body_read_timeout,
        )
        self.transport.close()


def timed_h11_protocol(header_read_timeout: float, body_read_timeout: float) -> type[H11Protocol]:
    """A ``TimedH11Protocol`` class with these deadlines (uvicorn's ``Config(http=...)``)."""
    return type(
        "ConfiguredTimedH11Protocol",
        (TimedH11Protocol,),
        {"header_read_timeout": header_read_timeout, "body_read_timeout": body_read_timeout},
    )


def httptools_available() -> bool:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return False
    return True


def http_protocol(kind: str, header_read_timeout: float, body_read_timeout: float) -> type:
    """The connection protocol class for ``kind`` ("auto": httptools when installed, the faster
    parser and writer of the two, else h11), with the read deadlines."""
    if kind == "auto":
        kind = "httptools" if httptools_available() else "h11"
    if kind == "httptools":
        from cadence.server.http_protocol_httptools import timed_httptools_protocol

        return timed_httptools_protocol(header_read_timeout, body_read_timeout)
    if kind == "h11":
        return timed_h11_protocol(header_read_timeout, body_read_timeout)
    raise ValueError(f"http must be 'auto', 'h11' or 'httptools', got {kind!r}.")
