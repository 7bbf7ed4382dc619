"""uvicorn's httptools connection protocol with the same read deadlines as the h11 one.

See ``http_protocol``: request headers must be complete within ``header_read_timeout`` of the
connection's opening (or of a kept-alive request's first byte), else 408 (when part of a request
came) and close; a request body the application does not read must end within
``body_read_timeout``, else close. httptools reports a request's first byte
(``on_message_begin``), the end of its headers and the end of its body, which is all the
deadlines need.

A request's bytes that are not its body (request line, headers, a chunked body's framing and
trailers) are bounded too: ``MAX_HEADER_BYTES``, plus ``FRAMING_PER_BODY_BYTE`` for each body
byte (a chunked body in one-byte chunks has five bytes of framing per byte). h11 bounds these
itself; uvicorn sets no bound for httptools, whose callbacks keep every byte. Past the bound
the client gets 431 (unless a response is already going out) and the connection closes, so one
client streaming an endless header or trailer cannot hold the event loop or grow the server's
memory. Bytes are counted by whole reads, each toward the request under way at its end, so the
bound holds within one read (at most 256 KiB).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cadence.server.errors import HeaderFieldsTooLargeError
from cadence.server.read_deadlines import ReadDeadlines, error_response, logger

__all__ = ["MAX_HEADER_BYTES", "TimedHttpToolsProtocol", "timed_httptools_protocol"]

MAX_HEADER_BYTES = 1 << 20
FRAMING_PER_BODY_BYTE = 8


class TimedHttpToolsProtocol(ReadDeadlines, HttpToolsProtocol):
    def connection_made(self, transport: Any) -> None:
        self._init_deadlines()
        self._partial = False  # part of a request came, its headers did not end
        self._framing = 0  # bytes of the request under way that were not body
        self._body_bytes = 0  # body bytes of the request under way
        self._read_body = 0  # body bytes of the read being parsed
        super().connection_made(transport)
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._read_body = 0
        super().data_received(data)
        if self.transport.is_closing():
            return
        self._framing += len(data) - self._read_body
        if self._framing > MAX_HEADER_BYTES + FRAMING_PER_BODY_BYTE * self._body_bytes:
            self._refuse()

    def on_body(self, body: bytes) -> None:
        self._read_body += len(body)
        self._body_bytes += len(body)
        super().on_body(body)

    def _refuse(self) -> None:
        self._disarm()
        peer = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        logger.info("Closed the connection of %s: its request headers exceed %d bytes.", peer,
                    MAX_HEADER_BYTES)
        cycle = self.cycle
        # NOTE: no answer into a response already going out (a pipelined request's).
        if cycle is None or cycle.response_complete or not cycle.response_started:
            err = HeaderFieldsTooLargeError(
                f"The request line and headers exceed {MAX_HEADER_BYTES} bytes.")
            self.transport.write(error_response(err))
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._partial = True
        self._framing = self._body_bytes = 0
        if self._read_phase is None:
            self._arm("headers")  # the first byte of a request on a kept-alive connection

    def on_headers_complete(self) -> None:
        self._partial = False
        super().on_headers_complete()
        if self.parser.get_http_version() == "1.0" and self.cycle is not None:
            _end_by_close(self.cycle)
        self._arm("body")  # cleared by on_message_complete: at once when there is no body

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._read_phase == "body":
            self._disarm()

    def timeout_keep_alive_handler(self) -> None:
        # NOTE: a pipelined request partly received is not an idle connection: its header
        # deadline answers it (408), rather than uvicorn's keep-alive timer closing silently.
        if self._partial:
            return
        super().timeout_keep_alive_handler()

    def timeout_action(self, phase: str) -> str:
        if phase == "headers":
            return "answer" if self._partial else "close"
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return "rearm"
        return "close"


_UNTIL_CLOSE = 1 << 62  # "bytes left" of a body that ends with the connection


def _end_by_close(cycle: Any) -> None:
    """An HTTP/1.0 request's response: a body of unknown length ends with the connection, as
    RFC 9112 has it (uvicorn's httptools cycle would frame it chunked, which a 1.0 client does
    not read; its h11 protocol does this itself). The cycle's own ``send`` is wrapped before
    the application runs (its task starts on the loop's next turn)."""
    send = cycle.send

    async def send_unframed(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            names = {name.lower() for name, _ in message.get("headers", [])}
            if not names & {b"content-length", b"transfer-encoding"}:
                cycle.chunked_encoding = False  # NOTE: read by the cycle's send below
                cycle.expected_content_length = _UNTIL_CLOSE
        elif (cycle.chunked_encoding is False and not message.get("more_body", False)
              and cycle.expected_content_length >= _UNTIL_CLOSE // 2):
            # The last piece: what is left is exactly it (the cycle then closes, keep-alive
            # being off for 1.0).
            cycle.expected_content_length = len(message.get("body", b""))
        await send(message)

    cycle.send = send_unframed


def timed_httptools_protocol(header_read_timeout: float, body_read_timeout: float) -> type:
    """A ``TimedHttpToolsProtocol`` class with these deadlines (uvicorn's ``Config(http=...)``)."""
    return type(
        "ConfiguredTimedHttpToolsProtocol",
        (TimedHttpToolsProtocol,),
        {"header_read_timeout": header_read_timeout, "body_read_timeout": body_read_timeout},
    )
