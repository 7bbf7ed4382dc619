"""Slow and careless clients at the socket level: read deadlines, keep-alive, 413 and 415 before
the body is read (no ``100 Continue``), and the server keeps serving everyone else."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import RunningServer, start_server, tiny_args

LIMIT = 4096


@pytest.fixture(scope="module", params=["h11", "httptools"])
def strict(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """A server with short read deadlines and a small body limit, on each HTTP implementation."""
    from cadence.engine.async_llm import AsyncLLM

    if request.param == "httptools":
        pytest.importorskip("httptools")
    running = start_server(
        AsyncLLM(tiny_args()),
        http=request.param,
        header_read_timeout=1.0,
        body_read_timeout=1.0,
        timeout_keep_alive=1.0,
        max_request_body_bytes=LIMIT,
    )
    yield running
    running.stop()


def connect(srv: RunningServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (the socket timeout is the safety bound)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def read_response(sock: socket.socket) -> bytes:
    """One complete response (head and Content-Length body), however it is split in segments."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        assert chunk, raw
        raw += chunk
    _, headers, body = split_response(raw)
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, raw
        body += chunk
        raw += chunk
    return raw


def split_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    return status, headers, body


def request_head(length: int, *extra: str, path: str = "/v1/completions") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_incomplete_headers_get_408_and_close(strict) -> None:
    with connect(strict) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n")
        status, headers, body = split_response(read_until_closed(sock))
    assert status == 408 and headers["connection"] == "close"
    assert json.loads(body)["error"]["type"] == "RequestTimeoutError"


def test_idle_connection_is_closed(strict) -> None:
    with connect(strict) as sock:
        assert read_until_closed(sock) == b""


def test_headers_dripped_byte_by_byte_are_cut_off(strict) -> None:
    head = request_head(2) + b"{}"
    with connect(strict) as sock:
        sent = 0
        closed = False
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            sent += 1
            time.sleep(0.05)  # a slowloris client; the deadline counts from the first byte
            sock.setblocking(False)
            try:
                if sock.recv(65536, socket.MSG_PEEK):
                    closed = True
                    break
            except BlockingIOError:
                pass
            finally:
                sock.setblocking(True)
        assert closed and sent < len(head)
        sock.settimeout(10)
        raw = read_until_closed(sock)
    assert raw == b"" or split_response(raw)[0] == 408


FLOODS = {
    # An endless header value; an endless run of trailer lines after a chunked body's last
    # chunk; one endless trailer value.
    "header": (b"GET /health HTTP/1.1\r\nHost: test\r\nX-Flood: ", b"a" * 65536),
    "trailer lines": (request_head(0, "Transfer-Encoding: chunked").replace(
        b"Content-Length: 0\r\n", b"") + b"2\r\n{}\r\n0\r\n", b"X-T: aaaa\r\n" * 5000),
    "trailer value": (request_head(0, "Transfer-Encoding: chunked").replace(
        b"Content-Length: 0\r\n", b"") + b"2\r\n{}\r\n0\r\nX-T: ", b"a" * 65536),
}


@pytest.mark.parametrize("flood", list(FLOODS))
def test_an_endless_header_is_refused_early(strict, request: pytest.FixtureRequest,
                                            caplog: pytest.LogCaptureFixture,
                                            flood: str) -> None:
    """Request line, headers and a chunked body's trailers that never end are cut off after a
    bounded size (httptools: 431 from the server's own bound, logged; h11: its 400), not read
    until a deadline; the server serves on."""
    from cadence.server.http_protocol_httptools import MAX_HEADER_BYTES

    impl = request.node.callspec.params["strict"]
    head, piece = FLOODS[flood]
    caplog.set_level(logging.INFO, logger="cadence.server.http_protocol")
    with connect(strict) as sock:
        sock.sendall(head)
        for _ in range(4 * MAX_HEADER_BYTES // len(piece)):
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
        raw = read_until_closed(sock)
    # NOTE: the answer may be lost to a reset (the server closes with the flood still unread).
    if raw and impl == "httptools":
        assert split_response(raw)[0] == 431
    elif raw:
        assert split_response(raw)[0] == 400
    if impl == "httptools":
        assert any("headers exceed" in r.getMessage() for r in caplog.records)
    with connect(strict) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        assert split_response(read_response(sock))[0] == 200


def test_a_chunked_body_in_one_byte_chunks_is_not_framing(strict) -> None:
    """A chunked body's framing is allowed in proportion to it (1-byte chunks: 5 bytes each)."""
    body = json.dumps({"prompt": "hi", "max_tokens": 1, "pad": "x" * 3000}).encode()
    assert len(body) < LIMIT
    chunks = b"".join(b"1\r\n" + bytes([c]) + b"\r\n" for c in body) + b"0\r\n\r\n"
    head = request_head(0, "Transfer-Encoding: chunked", "Content-Type: application/json")
    with connect(strict) as sock:
        sock.sendall(head.replace(b"Content-Length: 0\r\n", b"") + chunks)
        status, _, _ = split_response(read_response(sock))
    assert status == 200


def test_declared_body_never_sent_gets_408(strict) -> None:
    with connect(strict) as sock:
        sock.sendall(request_head(100, "Content-Type: application/json") + b'{"prompt":')
        status, headers, body = split_response(read_until_closed(sock))
    assert status == 408 and headers["connection"] == "close"
    assert "body" in json.loads(body)["error"]["message"]


def test_expect_continue_with_a_huge_body_gets_413_not_100(strict) -> None:
    with connect(strict) as sock:
        sock.sendall(request_head(10**12, "Expect: 100-continue"))
        raw = read_until_closed(sock)
    assert not raw.startswith(b"HTTP/1.1 100")
    status, headers, body = split_response(raw)
    assert status == 413 and headers["connection"] == "close"
    assert json.loads(body)["error"]["type"] == "RequestTooLargeError"


def test_too_large_content_length_is_refused_before_the_body(strict) -> None:
    with connect(strict) as sock:
        sock.sendall(request_head(10**9))  # no body at all: the answer cannot wait for it
        status, _, body = split_response(read_response(sock))
        assert status == 413 and json.loads(body)["error"]["code"] == 413
        # The rest of the body never comes: the connection is then closed.
        assert read_until_closed(sock) == b""


def chunked(body: bytes, size: int = 1000) -> bytes:
    """``body`` in Transfer-Encoding: chunked pieces of ``size`` bytes, then the last chunk."""
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


CHUNKED_HEAD = (b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")


def test_a_chunked_body_past_the_limit_is_413(strict) -> None:
    # No Content-Length to refuse up front: the limit is enforced on the bytes as they come.
    body = json.dumps({"prompt": "x" * LIMIT, "max_tokens": 2}).encode()
    assert len(body) > LIMIT
    with connect(strict) as sock:
        sock.sendall(CHUNKED_HEAD + chunked(body))
        status, _, answer = split_response(read_response(sock))
    assert status == 413
    assert json.loads(answer)["error"]["type"] == "RequestTooLargeError"
    # Within the limit, the same chunked framing is served.
    body = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
    with connect(strict) as sock:
        sock.sendall(CHUNKED_HEAD + chunked(body, size=7))
        status, _, answer = split_response(read_response(sock))
    assert status == 200 and json.loads(answer)["usage"]["completion_tokens"] == 2


def _sized(size: int) -> bytes:
    """A valid completions body of exactly ``size`` bytes (JSON padded with blanks)."""
    body = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
    return body + b" " * (size - len(body))


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_of_exactly_the_limit_is_served_and_one_byte_more_is_413(strict, framing) -> None:
    for size, status in ((LIMIT, 200), (LIMIT + 1, 413)):
        body = _sized(size)
        assert len(body) == size
        with connect(strict) as sock:
            if framing == "chunked":
                sock.sendall(CHUNKED_HEAD + chunked(body))
            else:
                sock.sendall(request_head(size, "Content-Type: application/json") + body)
            got, _, answer = split_response(read_response(sock))
        assert got == status, (size, answer)
        if status == 200:
            assert json.loads(answer)["usage"]["completion_tokens"] == 2


def test_expect_continue_within_the_limit_gets_100(strict) -> None:
    body = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
    with connect(strict) as sock:
        sock.sendall(request_head(len(body), "Expect: 100-continue"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        status, _, answer = split_response(read_response(sock))
        assert status == 200 and json.loads(answer)["usage"]["completion_tokens"] == 2
        # Then the kept-alive connection idles out.
        rest = read_until_closed(sock)
    assert b"HTTP/1.1" not in rest


def test_non_json_content_type_is_415_and_json_types_are_accepted(strict) -> None:
    with httpx.Client(base_url=strict.base_url, timeout=30) as http:
        # x-ndjson ends in "json" but is a stream of documents, not one JSON object.
        for ctype in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data",
                      "application/x-ndjson"):
            resp = http.post("/v1/completions", content=b"prompt=x", headers={"content-type": ctype})
            assert resp.status_code == 415, resp.text
            assert resp.json()["error"]["type"] == "UnsupportedMediaTypeError"
        body = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
        for ctype in ("application/json", "application/json; charset=utf-8", "Application/JSON",
                      "application/vnd.api+json"):
            resp = http.post("/v1/completions", content=body, headers={"content-type": ctype})
            assert resp.status_code == 200, (ctype, resp.text)
        resp = http.post("/v1/completions", content=body)  # no Content-Type at all
        assert resp.status_code == 200


def test_compressed_body_is_415_naming_the_encoding(strict) -> None:
    import gzip

    body = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
    with httpx.Client(base_url=strict.base_url, timeout=30) as http:
        # A gzip body was parsed as JSON (a 400 about UTF-8); a plain one labelled gzip served.
        for content, coding in ((gzip.compress(body), "gzip"), (body, "gzip"), (body, "br"),
                                (body, "identity, gzip")):
            resp = http.post("/v1/completions", content=content,
                             headers={"content-type": "application/json",
                                      "content-encoding": coding})
            assert resp.status_code == 415, (coding, resp.text)
            err = resp.json()["error"]
            assert err["type"] == "UnsupportedMediaTypeError" and coding in err["message"]
        for coding in ("identity", "Identity"):
            resp = http.post("/v1/completions", content=body,
                             headers={"content-type": "application/json",
                                      "content-encoding": coding})
            assert resp.status_code == 200, (coding, resp.text)


def test_server_still_serves_after_slow_clients(strict) -> None:
    with httpx.Client(base_url=strict.base_url, timeout=30) as http:
        assert http.get("/health").status_code == 200
        resp = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3})
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3


def test_an_http_1_0_stream_ends_with_the_connection_not_chunked(strict) -> None:
    """RFC 9112: no chunked framing toward an HTTP/1.0 client; a streamed answer's body runs
    until the server closes. HTTP/1.1 clients still get chunks, and 1.0 ones fixed-length
    answers with their Content-Length."""
    body = json.dumps({"prompt": "hi", "max_tokens": 3, "stream": True}).encode()
    for version in ("1.0", "1.1"):
        with connect(strict) as sock:
            head = request_head(len(body), "Connection: close").replace(b"HTTP/1.1",
                                                                       f"HTTP/{version}".encode())
            sock.sendall(head + body)
            status, headers, payload = split_response(read_until_closed(sock))
        assert status == 200
        chunked = headers.get("transfer-encoding") == "chunked"
        assert chunked == (version == "1.1"), (version, headers)
        if not chunked:  # the events themselves, unframed, to the end
            events = [ln for ln in payload.decode().split("\n") if ln.startswith("data: ")]
            assert events[-1] == "data: [DONE]" and len(events) >= 2
            assert "content-length" not in headers and headers.get("connection") == "close"
    with connect(strict) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.0\r\n\r\n")
        status, headers, payload = split_response(read_until_closed(sock))
    assert status == 200 and int(headers["content-length"]) == len(payload)
    assert json.loads(payload)["data"][0]["id"] == "tiny"


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_partial_pipelined_request_gets_408_not_a_silent_close(http: str) -> None:
    """A complete request and the start of another in one read: the first is answered, then
    the second's header deadline answers it 408, though the keep-alive timer is shorter."""
    from cadence.engine.async_llm import AsyncLLM

    if http == "httptools":
        pytest.importorskip("httptools")
    running = start_server(AsyncLLM(tiny_args()), http=http, header_read_timeout=1.5,
                           timeout_keep_alive=0.2)
    try:
        with connect(running) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"
                         b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n")
            raw = read_until_closed(sock)
        first, _, rest = raw.partition(b"HTTP/1.1 408")
        assert split_response(first)[0] == 200
        status, headers, body = split_response(b"HTTP/1.1 408" + rest)
        assert status == 408 and headers["connection"] == "close"
        assert json.loads(body)["error"]["type"] == "RequestTimeoutError"
    finally:
        running.stop()
