"""Graceful shutdown: SIGINT and SIGTERM alike stop new requests, let in-flight ones finish
within --shutdown-timeout, then end each with an error (never a normal finish) and exit 0."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.conftest import free_port
from tests.server.waiting import answers_health, metric, spawn_serve, wait_until

PROMPT = "Hello my name is Robert and"


def test_a_draining_server_refuses_new_requests(server_factory) -> None:
    srv = server_factory()
    srv.server.lifecycle.stop_accepting()
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        for route, body in (
            ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
            ("/v1/responses", {"model": "tiny", "input": "hi"}),
        ):
            resp = http.post(route, json=body)
            assert resp.status_code == 503 and resp.headers["connection"] == "close"
            assert resp.json()["error"]["type"] == "ServiceUnavailableError"
        assert http.get("/health").status_code == 503


def test_in_flight_requests_finish_within_the_timeout(server_factory) -> None:
    srv = server_factory(app_kwargs={"shutdown_timeout": 60.0})
    body = {"prompt": PROMPT, "max_tokens": 40, "ignore_eos": True, "temperature": 0}
    result: dict[str, httpx.Response] = {}

    def non_streamed() -> None:
        with httpx.Client(base_url=srv.base_url, timeout=60) as other:
            result["resp"] = other.post("/v1/completions", json=body)

    with httpx.Client(base_url=srv.base_url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            waiter = threading.Thread(target=non_streamed)
            waiter.start()
            wait_until(
                lambda: srv.engine.output_processor.get_num_unfinished_requests() == 2,
                "both requests in the engine",
            )
            srv.server.should_exit = True  # what a signal does
            frames = [line for line in lines if line.startswith("data: ")]
        waiter.join(60)
    assert frames[-1] == "data: [DONE]"
    assert json.loads(frames[-2][6:])["choices"][0]["finish_reason"] == "length"
    assert result["resp"].status_code == 200
    assert result["resp"].json()["usage"]["completion_tokens"] == 40
    srv.thread.join(30)
    assert not srv.thread.is_alive() and srv.server.exit_code == 0


def test_a_responses_stream_is_drained_then_ended_with_its_error_event(server_factory) -> None:
    """/v1/responses is a generation route like the others: counted while in flight (the
    drain waits for it) and, past the shutdown timeout, ended with its error event."""
    srv = server_factory(app_kwargs={"shutdown_timeout": 0.0})
    body = {"model": "tiny", "input": PROMPT, "max_output_tokens": 450, "stream": True,
            "ignore_eos": True}
    with httpx.Client(base_url=srv.base_url, timeout=60) as http:
        with http.stream("POST", "/v1/responses", json=body) as r:
            lines = r.iter_lines()
            next(line for line in lines if "response.output_text.delta" in line)
            assert srv.server.lifecycle.in_flight == 1
            srv.server.should_exit = True  # what a signal does
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert events[-2]["type"] == "error" and "shutting down" in events[-2]["message"]
    failed = events[-1]
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "server_error"
    assert "shutting down" in failed["response"]["error"]["message"]
    assert not any(e["type"] == "response.completed" for e in events)
    srv.thread.join(30)
    assert not srv.thread.is_alive() and srv.server.exit_code == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_ends_in_flight_requests_with_errors_and_exits_0(
    sig: signal.Signals, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    proc = spawn_serve(["tiny", "--port", str(port), "--max-model-len", "2048",
                        "--num-gpu-blocks-override", "1024", "--shutdown-timeout", "0.5"], log)
    base = f"http://127.0.0.1:{port}"
    long = {"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True}
    try:
        wait_until(lambda: answers_health(proc, base, log), "the server to start", timeout=120,
                   interval=0.2)
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=60)
        outcomes: dict[str, object] = {}
        started = threading.Barrier(3)

        def sdk_stream() -> None:
            chunks = []
            stream = client.completions.create(
                model="tiny", prompt=PROMPT, max_tokens=2000, stream=True,
                extra_body={"ignore_eos": True},
            )
            try:
                for chunk in stream:
                    if not chunks:
                        started.wait(30)
                    chunks.append(chunk)
            except openai.APIError as exc:
                outcomes["sdk"] = (chunks, exc)
                return
            outcomes["sdk"] = (chunks, None)

        def raw_stream() -> None:
            frames = []
            with httpx.stream("POST", base + "/v1/completions", json={**long, "stream": True},
                              timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        if not frames:
                            started.wait(30)
                        frames.append(line)
            outcomes["raw"] = frames

        def non_streamed() -> None:
            outcomes["plain"] = httpx.post(base + "/v1/completions", json=long, timeout=60)

        threads = [threading.Thread(target=f) for f in (sdk_stream, raw_stream, non_streamed)]
        for t in threads:
            t.start()
        started.wait(30)  # both streams have their first chunk
        wait_until(
            lambda: metric(httpx.get(base + "/metrics").text, "cadence:num_requests_running") == 3,
            "three requests running",
        )
        proc.send_signal(sig)
        for t in threads:
            t.join(60)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert rc == 0, text
    # The SDK sees an error, not a finished completion.
    chunks, error = outcomes["sdk"]
    assert error is not None and "shutting down" in str(error)
    assert all(c.choices[0].finish_reason is None for c in chunks if c.choices)
    # On the wire: an error event, then [DONE]; no chunk claims a finish.
    frames = outcomes["raw"]
    assert frames[-1] == "data: [DONE]"
    err = json.loads(frames[-2][6:])["error"]
    assert err["code"] == 503 and err["type"] == "ServiceUnavailableError"
    assert all(json.loads(f[6:])["choices"][0]["finish_reason"] is None for f in frames[:-2])
    plain = outcomes["plain"]
    assert plain.status_code == 503 and plain.json()["error"]["code"] == 503
    # One line per cause, no tracebacks.
    assert "Traceback" not in text and "CancelledError" not in text
    assert text.count(f"Received {sig.name}") == 1
    assert text.count("Shutdown timeout of 0.5 s reached: ending 3 in-flight") == 1
    assert len(text.splitlines()) < 40, text
