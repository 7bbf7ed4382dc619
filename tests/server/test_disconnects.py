"""A client that leaves (mid-stream, while waiting for a non-streamed answer, or mid-upload)
aborts its request with exactly one INFO line: no 500, no warning, no traceback."""

from __future__ import annotations

import json
import logging
import socket

import httpx
import pytest

from tests.server.waiting import metric, scrape, wait_released, wait_until

LONG = {"prompt": "Hello my name is", "max_tokens": 400, "ignore_eos": True}


def _head(length: int) -> bytes:
    return (
        "POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _quiet_one_line(caplog, fragment: str) -> None:
    lines = wait_until(
        lambda: [r for r in caplog.records if fragment in r.getMessage()], repr(fragment)
    )
    assert len(lines) == 1 and lines[0].levelno == logging.INFO, lines
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert noisy == [], [r.getMessage() for r in noisy]


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
def test_disconnect_aborts_with_one_info_line(server_factory, caplog, stream: bool) -> None:
    caplog.set_level(logging.INFO)
    srv = server_factory()
    body = json.dumps({**LONG, "stream": stream}).encode()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(_head(len(body)) + body)
        if stream:
            assert sock.recv(65536)  # the stream started
        wait_until(lambda: srv.engine.output_processor.has_unfinished_requests(), "a request")
    _quiet_one_line(caplog, "disconnected")
    wait_released(srv.engine)
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        text = scrape(http)
        assert metric(text, "cadence:request_success_total", finished_reason="abort") == 1
        assert http.get("/health").status_code == 200


def test_body_cut_off_mid_upload_is_one_info_line(server_factory, caplog) -> None:
    caplog.set_level(logging.INFO)
    srv = server_factory()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(_head(1000) + b'{"prompt": "Hello, this body never ')
    _quiet_one_line(caplog, "disconnected while sending the request body")
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        assert http.get("/health").status_code == 200
        ok = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert ok.status_code == 200


def test_an_n_request_that_fails_counts_every_choice_once(server_factory) -> None:
    """A choice of an n = 4 request fails at its first step (a grammar no allowed token can
    follow): a 400, and every choice is counted once in request_success_total (the failed
    one "error", its three siblings, ended unsent, "abort"), with the request's own figures
    (request_params_n) recorded once."""
    srv = server_factory()
    body = {"prompt": "b", "n": 4, "temperature": 1.0, "max_tokens": 5,
            "structured_outputs": {"regex": "[0-9]+"}, "allowed_token_ids": [5]}
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        before = scrape(http)
        resp = http.post("/v1/completions", json=body)
        assert resp.status_code == 400, resp.text

        def counted(text: str, name: str, **labels: str) -> float:
            return metric(text, name, **labels) - metric(before, name, **labels)

        text = wait_until(lambda: (lambda t: t if counted(
            t, "cadence:e2e_request_latency_seconds_count") == 4 else None)(scrape(http)),
            "every choice counted")
        assert counted(text, "cadence:request_success_total", finished_reason="error") == 1
        assert counted(text, "cadence:request_success_total", finished_reason="abort") == 3
        assert counted(text, "cadence:request_params_n_count") == 1
        assert counted(text, "cadence:request_params_n_sum") == 4
    wait_released(srv.engine)


def test_a_responses_request_whose_client_left_is_aborted(server_factory) -> None:
    """A non-streamed /v1/responses request stops generating when its client disconnects:
    counted as aborted, not as finished by length."""
    srv = server_factory()
    body = json.dumps({"model": "tiny", "input": "Hello my name is", "max_output_tokens": 400,
                       "ignore_eos": True}).encode()
    head = _head(len(body)).replace(b"/v1/completions", b"/v1/responses")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(head + body)
        wait_until(lambda: srv.engine.output_processor.has_unfinished_requests(), "a request")
    wait_released(srv.engine)
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        text = scrape(http)
        assert metric(text, "cadence:request_success_total", finished_reason="abort") == 1
        assert metric(text, "cadence:request_success_total", finished_reason="length") == 0
