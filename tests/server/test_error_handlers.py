"""An error no handler expects: a logged OpenAI-style 500, once, on a connection that stays
open for the client's next request (a real server, one raw keep-alive socket)."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from tests.server.conftest import ServerFactory


def _exchange(sock: socket.socket, request: bytes) -> tuple[int, bytes]:
    """Send one HTTP/1.1 request and read its whole response (Content-Length framed)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection mid-body"
        body += chunk
    return int(lines[0].split()[1]), body[:length]


def _post(path: str, payload: dict) -> bytes:
    body = json.dumps(payload).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


GET_HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def test_an_unexpected_error_is_one_logged_500_and_the_connection_serves_on(
    server_factory: ServerFactory, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    srv = server_factory()

    def broken(*args, **kwargs):
        raise RuntimeError("planted failure")

    # The /tokenize route renders a conversation through this name.
    monkeypatch.setattr("cadence.server.tokenization.render_chat", broken)
    messages = [{"role": "user", "content": "Hi"}]
    with caplog.at_level(logging.ERROR), socket.create_connection(
            ("127.0.0.1", srv.port), timeout=30) as sock:
        status, body = _exchange(sock, _post("/tokenize", {"messages": messages}))
        assert status == 500, body
        err = json.loads(body)["error"]
        assert (err["code"], err["type"]) == (500, "InternalServerError")
        assert "planted failure" in err["message"]
        # Same socket: the keep-alive connection was not dropped.
        assert _exchange(sock, GET_HEALTH)[0] == 200
        monkeypatch.undo()
        status, body = _exchange(sock, _post("/tokenize", {"messages": messages}))
        assert status == 200 and json.loads(body)["count"] > 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    # Logged once, by the handler: not a second time by the server (Starlette re-raised).
    assert [r.getMessage() for r in errors] == ["Unhandled error in POST '/tokenize'"]
    assert errors[0].exc_info is not None and "planted failure" in str(errors[0].exc_info[1])
