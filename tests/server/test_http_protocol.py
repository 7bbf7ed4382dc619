"""The h11 protocol's read deadlines, fed directly (no socket, no waiting for a timer): which
deadline is armed, for how long, and what its expiry does to the connection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from tests.server.fake_transport import FakeTransport

HEADER_S, BODY_S = 5.0, 7.0


async def _answer_without_reading(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _read_the_body(scope: dict, receive: Any, send: Any) -> None:
    while (await receive()).get("more_body"):
        pass
    await _answer_without_reading(scope, receive, send)


def _run(app: Callable[..., Awaitable[None]], check: Callable[..., Awaitable[None]]) -> None:
    import uvicorn
    from uvicorn.server import ServerState

    from cadence.server.http_protocol import timed_h11_protocol

    async def main() -> None:
        cls = timed_h11_protocol(HEADER_S, BODY_S)
        config = uvicorn.Config(app, http=cls, lifespan="off", log_config=None)
        loop = asyncio.get_running_loop()
        proto = cls(config, ServerState(), {}, loop)
        transport = FakeTransport()
        before = loop.time()
        proto.connection_made(transport)
        await check(proto, transport, loop, before)
        proto.connection_lost(None)

    asyncio.run(main())


def _armed(proto: Any, phase: str, seconds: float, since: float, loop: Any) -> None:
    """``phase``'s deadline is armed, ``seconds`` from a moment between ``since`` and now."""
    assert proto._read_phase == phase
    when = proto._read_timer.when()
    assert since + seconds <= when <= loop.time() + seconds


def _expire(proto: Any) -> None:
    """Run the armed deadline's expiry now, as the event loop would when it passes."""
    timer = proto._read_timer
    callback, args = timer._callback, timer._args
    timer.cancel()
    callback(*args)


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0)  # the application's task runs


def test_an_idle_new_connection_is_closed_without_an_answer() -> None:
    async def check(proto: Any, transport: FakeTransport, loop: Any, since: float) -> None:
        _armed(proto, "headers", HEADER_S, since, loop)
        _expire(proto)
        assert transport.closed and transport.out == b""

    _run(_answer_without_reading, check)


def test_headers_incomplete_at_the_deadline_get_a_408_that_closes() -> None:
    async def check(proto: Any, transport: FakeTransport, loop: Any, since: float) -> None:
        proto.data_received(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n")
        _armed(proto, "headers", HEADER_S, since, loop)  # from the opening, not the bytes
        _expire(proto)
        assert transport.closed
        head, _, body = bytes(transport.out).partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        assert lines[0] == "HTTP/1.1 408 Request Timeout"
        assert "connection: close" in lines and f"content-length: {len(body)}" in lines
        error = json.loads(body)["error"]
        assert error["code"] == 408 and "5 s" in error["message"]

    _run(_answer_without_reading, check)


def test_a_body_the_application_does_not_read_must_end_within_the_body_deadline() -> None:
    """Answered before its body came (as a 413 is): the body deadline, not the header one,
    and at its expiry the connection closes with nothing more written."""
    async def check(proto: Any, transport: FakeTransport, loop: Any, since: float) -> None:
        proto.data_received(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
        await _until(lambda: b"ok" in transport.out)
        _armed(proto, "body", BODY_S, since, loop)
        answered = bytes(transport.out)
        _expire(proto)
        assert transport.closed and bytes(transport.out) == answered

    _run(_answer_without_reading, check)


def test_a_body_the_application_is_reading_is_left_to_the_application() -> None:
    """The application reads the body (its own deadline answers it): the protocol's body
    deadline is armed again, the connection stays open, and a body that then ends is served."""
    async def check(proto: Any, transport: FakeTransport, loop: Any, since: float) -> None:
        proto.data_received(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 6\r\n\r\nabc")
        await asyncio.sleep(0)
        _armed(proto, "body", BODY_S, since, loop)
        rearmed_since = loop.time()
        _expire(proto)
        assert not transport.closed
        _armed(proto, "body", BODY_S, rearmed_since, loop)
        proto.data_received(b"def")
        assert proto._read_phase is None  # the body is complete: no deadline runs
        await _until(lambda: b"ok" in transport.out)
        assert not transport.closed and transport.out.startswith(b"HTTP/1.1 200 OK")

    _run(_read_the_body, check)


def test_a_kept_alive_requests_header_deadline_starts_at_its_first_byte() -> None:
    async def check(proto: Any, transport: FakeTransport, loop: Any, since: float) -> None:
        proto.data_received(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
        await _until(lambda: b"ok" in transport.out)
        assert proto._read_phase is None  # kept alive: uvicorn's keep-alive timer runs
        second = loop.time()
        proto.data_received(b"GET /x HTTP/1.1\r\nHo")
        _armed(proto, "headers", HEADER_S, second, loop)
        # A request partly received is no idle connection: uvicorn's keep-alive timer, which
        # may pass first, leaves it to the header deadline (which answers it).
        proto.timeout_keep_alive_handler()
        assert not transport.closed
        _expire(proto)
        assert transport.closed
        assert bytes(transport.out).count(b"HTTP/1.1 408 Request Timeout") == 1

    _run(_answer_without_reading, check)


def test_more_of_a_body_does_not_restart_its_deadline() -> None:
    """A body dripped a byte at a time must still end within the body deadline of its headers'
    end: each chunk leaves the deadline where it was."""
    async def check(proto: Any, transport: FakeTransport, loop: Any, since: float) -> None:
        proto.data_received(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\na")
        await _until(lambda: b"ok" in transport.out)
        timer = proto._read_timer
        _armed(proto, "body", BODY_S, since, loop)
        for byte in (b"b", b"c", b"d"):
            proto.data_received(byte)
            assert proto._read_timer is timer and not timer.cancelled()

    _run(_answer_without_reading, check)


def test_a_body_that_ends_with_the_next_requests_start_arms_its_header_deadline() -> None:
    """The rest of an unread body and the start of a pipelined request in one read: the body
    deadline ends and the new request's header deadline runs (it answers 408 at expiry)."""
    async def check(proto: Any, transport: FakeTransport, loop: Any, since: float) -> None:
        proto.data_received(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nab")
        await _until(lambda: b"ok" in transport.out)
        body_timer = proto._read_timer
        _armed(proto, "body", BODY_S, since, loop)
        second = loop.time()
        proto.data_received(b"cPOST /v1/completions HTTP/1.1\r\nHo")
        assert body_timer.cancelled()
        _armed(proto, "headers", HEADER_S, second, loop)
        _expire(proto)
        assert transport.closed
        assert bytes(transport.out).count(b"HTTP/1.1 408 Request Timeout") == 1

    _run(_answer_without_reading, check)
