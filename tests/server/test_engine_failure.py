"""An engine-thread crash fails in-flight requests promptly (500 / SSE error frame) and makes
/health report unhealthy; clean shutdown ends the server."""

from __future__ import annotations

import json
import threading
import time

import httpx

from cadence.engine.core import EngineCore
from cadence.engine.engine_args import EngineArgs

PROMPT = "Hello my name is Robert and"


class ArmedCore(EngineCore):
    """The real core; once ``armed`` is set, its next step raises."""

    def __init__(self, args: EngineArgs) -> None:
        super().__init__(args)
        self.armed = threading.Event()

    @property
    def step_fn(self):
        inner = super().step_fn

        def step():
            if self.armed.is_set():
                raise RuntimeError("injected engine failure")
            return inner()

        return step


def test_crash_fails_in_flight_requests_and_health(server_factory) -> None:
    srv = server_factory(core_factory=ArmedCore)
    core = srv.engine.engine_core.proc.engine_core
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        assert http.get("/health").status_code == 200
        body = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "ignore_eos": True}
        result: dict[str, httpx.Response] = {}

        def non_streamed() -> None:
            with httpx.Client(base_url=srv.base_url, timeout=30) as other:
                result["resp"] = other.post("/v1/completions", json=body)

        waiter = threading.Thread(target=non_streamed)
        frames: list[str] = []
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            lines = r.iter_lines()
            for line in lines:  # the stream is running
                if line.startswith("data: "):
                    frames.append(line)
                    break
            waiter.start()
            time.sleep(0.2)
            core.armed.set()
            start = time.monotonic()
            for line in lines:
                if line.startswith("data: "):
                    frames.append(line)
            failed_after = time.monotonic() - start
        waiter.join(30)
        assert failed_after < 5
        # The stream ends with an error frame, then [DONE].
        assert frames[-1] == "data: [DONE]"
        err = json.loads(frames[-2][6:])["error"]
        assert err["code"] == 500 and "engine" in err["message"].lower()
        # The waiting non-streamed request gets a 500-class answer.
        resp = result["resp"]
        assert 500 <= resp.status_code < 600
        assert resp.json()["error"]["code"] == resp.status_code
        # Health says so, and new requests are refused at once.
        health = http.get("/health")
        assert health.status_code == 503
        resp = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert 500 <= resp.status_code < 600
        assert http.get("/metrics").status_code == 200


def test_clean_shutdown(server_factory) -> None:
    srv = server_factory()
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        ok = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert ok.status_code == 200
    srv.stop()
    assert not srv.thread.is_alive()
    assert not srv.engine.engine_core.proc.thread.is_alive()
    assert srv.engine.errored
