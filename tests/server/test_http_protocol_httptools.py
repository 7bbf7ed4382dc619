"""The httptools protocol's bound on a request's non-body bytes, fed directly (no socket)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("httptools")

from tests.server.fake_transport import FakeTransport  # noqa: E402


async def _ok(scope: dict, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_header_bound_is_per_request_on_a_kept_alive_connection() -> None:
    """Each request's headers may come near MAX_HEADER_BYTES: three such requests one after
    another on one connection are all served (the count starts again at each request), while
    one request past the bound is refused (431, closed)."""
    import uvicorn
    from uvicorn.server import ServerState

    from cadence.server.http_protocol_httptools import MAX_HEADER_BYTES, timed_httptools_protocol

    def request(pad: int) -> bytes:
        return f"GET /x HTTP/1.1\r\nHost: t\r\nX-Pad: {'p' * pad}\r\n\r\n".encode()

    async def main() -> None:
        cls = timed_httptools_protocol(60.0, 60.0)
        config = uvicorn.Config(_ok, http=cls, lifespan="off", log_config=None)
        proto = cls(config, ServerState(), {}, asyncio.get_running_loop())
        transport = FakeTransport()
        proto.connection_made(transport)
        near = request(MAX_HEADER_BYTES * 3 // 5)  # 60% of the bound: two together exceed it
        for n in (1, 2, 3):
            proto.data_received(near)
            while transport.out.count(b"HTTP/1.1 ") < n and not transport.closed:
                await asyncio.sleep(0)  # the application's task answers
            assert not transport.closed, bytes(transport.out[-300:])
            assert transport.out.count(b"HTTP/1.1 200 OK") == n
        proto.connection_lost(None)

        proto = cls(config, ServerState(), {}, asyncio.get_running_loop())
        transport = FakeTransport()
        proto.connection_made(transport)
        proto.data_received(request(MAX_HEADER_BYTES + 1))
        assert transport.closed and transport.out.startswith(b"HTTP/1.1 431 ")
        proto.connection_lost(None)

    asyncio.run(main())
