"""Read deadlines of an HTTP connection, shared by the h11 and httptools protocols.

A protocol arms the "headers" deadline when a connection opens (or a kept-alive request's first
byte arrives) and the "body" deadline when a request's headers are complete, and disarms it
when the body is complete. When a deadline passes, ``timeout_action`` says what the protocol
sees (part of a request came; the application is still reading the body) and the connection is
answered 408 or closed accordingly.
"""

from __future__ import annotations

import asyncio
import json
import logging
from http import HTTPStatus
from typing import Any

from cadence.server.errors import APIError, RequestTimeoutError

__all__ = ["ReadDeadlines", "error_response", "timeout_response"]

logger = logging.getLogger("cadence.server.http_protocol")


def error_response(err: APIError) -> bytes:
    """A whole HTTP/1.1 response carrying ``err`` (JSON), that closes the connection."""
    body = json.dumps(err.body()).encode("ascii")
    head = (
        f"HTTP/1.1 {int(err.status_code)} {HTTPStatus(err.status_code).phrase}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def timeout_response(timeout: float) -> bytes:
    return error_response(
        RequestTimeoutError(f"The request headers were not received within {timeout:g} s."))


class ReadDeadlines:
    """Mixin of a uvicorn connection protocol (it has ``loop``, ``transport``, ``client``)."""

    header_read_timeout: float = 20.0
    body_read_timeout: float = 60.0
    loop: asyncio.AbstractEventLoop
    transport: Any
    client: tuple[str, int] | None

    def _init_deadlines(self) -> None:
        self._read_timer: asyncio.TimerHandle | None = None
        self._read_phase: str | None = None

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

    def timeout_action(self, phase: str) -> str:
        """What to do when ``phase``'s deadline passes: "answer" (408 and close), "close",
        "rearm" (the application reads the body and answers its own timeout) or "ignore"."""
        raise NotImplementedError

    def _on_timeout(self, phase: str) -> None:
        self._read_timer = None
        self._read_phase = None
        if self.transport.is_closing():
            return
        action = self.timeout_action(phase)
        if action == "ignore":
            return
        if action == "rearm":
            self._arm(phase)
            return
        peer = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        if phase == "headers":
            if action == "answer":
                logger.info(
                    "Closed the connection of %s: request headers incomplete after %g s.",
                    peer,
                    self.header_read_timeout,
                )
                self.transport.write(timeout_response(self.header_read_timeout))
            else:
                logger.debug("Closed the idle connection of %s.", peer)
        else:
            logger.info(
                "Closed the connection of %s: the rest of a request body did not come within "
                "%g s.",
                peer,
                self.body_read_timeout,
            )
        self.transport.close()
