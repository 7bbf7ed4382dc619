"""uvicorn's httptools connection protocol with the same read deadlines as the h11 one.

See ``http_protocol``: request headers must be complete within ``header_read_timeout`` of the
connection's opening (or of a kept-alive request's first byte), else 408 (when part of a request
came) and close; a request body the application does not read must end within
``body_read_timeout``, else close. httptools reports a request's first byte
(``on_message_begin``), the end of its headers and the end of its body, which is all the
deadlines need.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cadence.server.http_protocol import _timeout_response

__all__ = ["TimedHttpToolsProtocol", "timed_httptools_protocol"]

logger = logging.getLogger("cadence.server.http_protocol")


class TimedHttpToolsProtocol(HttpToolsProtocol):
    header_read_timeout: float = 20.0
    body_read_timeout: float = 60.0

    def connection_made(self, transport: Any) -> None:
        self._read_timer: asyncio.TimerHandle | None = None
        self._read_phase: str | None = None
        self._partial = False  # part of a request came, its headers did not end
        super().connection_made(transport)
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._partial = True
        if self._read_phase is None:
            self._arm("headers")  # the first byte of a request on a kept-alive connection

    def on_headers_complete(self) -> None:
        self._partial = False
        super().on_headers_complete()
        self._arm("body")  # cleared by on_message_complete: at once when there is no body

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._read_phase == "body":
            self._disarm()

    # -- deadlines ---------------------------------------------------------------------------
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
            if self._partial:
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
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            self._arm("body")  # the application reads this body and answers its timeout
            return
        logger.info(
            "Closed the connection of %s: the rest of a request body did not come within %g s.",
            peer,
            self.body_read_timeout,
        )
        self.transport.close()


def timed_httptools_protocol(header_read_timeout: float, body_read_timeout: float) -> type:
    """A ``TimedHttpToolsProtocol`` class with these deadlines (uvicorn's ``Config(http=...)``)."""
    return type(
        "ConfiguredTimedHttpToolsProtocol",
        (TimedHttpToolsProtocol,),
        {"header_read_timeout": header_read_timeout, "body_read_timeout": body_read_timeout},
    )
