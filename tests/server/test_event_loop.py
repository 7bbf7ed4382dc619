"""Per-request CPU work stays off the event loop: while a prompt is being tokenized (held
here), /health answers and a running stream keeps streaming."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx

from tests.server.waiting import wait_until


class HeldTokenizer:
    """The real tokenizer, whose ``encode`` waits for ``release`` once ``hold`` is set."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.hold = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        self.calls += 1
        if self.hold.is_set():
            self.entered.set()
            self.release.wait(30)
        return self._inner.encode(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_tokenizing_does_not_block_the_event_loop(server_factory) -> None:
    srv = server_factory()
    engine = srv.engine
    held = HeldTokenizer(engine.tokenizer)
    engine.input_processor.tokenizer = held
    engine.tokenizer = held  # the chat path renders and encodes through this one
    long_body = {"prompt": "Hello", "max_tokens": 300, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=long_body) as stream:
            lines = stream.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            held.hold.set()
            results: dict[str, httpx.Response] = {}

            def blocked(route: str, body: dict[str, Any]) -> None:
                with httpx.Client(base_url=srv.base_url, timeout=30) as other:
                    results[route] = other.post(route, json=body)

            waiters = [
                threading.Thread(
                    target=blocked, args=("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
                ),
                threading.Thread(
                    target=blocked,
                    args=(
                        "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                    ),
                ),
            ]
            for w in waiters:
                w.start()
            assert held.entered.wait(10)
            # The loop is free: health answers and the stream goes on while encode is held.
            assert http.get("/health").status_code == 200
            more = 0
            for line in lines:
                if line.startswith("data: ") and line != "data: [DONE]":
                    more += 1
                    if more == 20:
                        break
            assert more == 20
            held.release.set()
            for w in waiters:
                w.join(30)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
    for route, resp in results.items():
        assert resp.status_code == 200, (route, resp.text)
    wait_until(lambda: not engine.output_processor.has_unfinished_requests(), "idle engine")


def test_overlong_text_is_refused_without_tokenizing(server_factory) -> None:
    srv = server_factory()
    engine = srv.engine
    held = HeldTokenizer(engine.tokenizer)
    engine.input_processor.tokenizer = held
    engine.tokenizer = held
    k = engine.input_processor.max_chars_per_token
    assert k is not None
    text = "word " * (k * engine.max_model_len // 5 + 1)
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        resp = http.post("/v1/completions", json={"prompt": text, "max_tokens": 2})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt"
        assert "maximum context length" in resp.json()["error"]["message"]
        chat = {"messages": [{"role": "user", "content": text}], "max_tokens": 2}
        resp = http.post("/v1/chat/completions", json=chat)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"
    assert held.calls == 0
