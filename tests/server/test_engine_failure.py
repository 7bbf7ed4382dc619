"""Engine faults: a crash fails in-flight requests promptly with 503s, /health and /metrics say
so, and the server exits with status 1 after a grace period; a stall turns /health 503 (with a
log line) until the engine makes progress again; a request failing alone after its stream
started ends with an error event (on /v1/responses, then ``response.failed``)."""

from __future__ import annotations

import json
import logging
import threading

import httpx
import openai
import pytest

from cadence.engine.core import EngineCore
from cadence.engine.engine_args import EngineArgs
from tests.gated_core import GatedCore
from tests.server.waiting import metric, scrape, wait_released, wait_until

PROMPT = "Hello my name is Robert and"
LONG = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "ignore_eos": True}


class FaultyCore(EngineCore):
    """The real core; its next step raises once ``armed`` is set, or blocks while ``hang`` is."""

    def __init__(self, args: EngineArgs) -> None:
        super().__init__(args)
        self.armed = threading.Event()
        self.hang = threading.Event()
        self.hanging = threading.Event()
        self.release = threading.Event()

    @property
    def step_fn(self):
        inner = super().step_fn

        def step():
            if self.armed.is_set():
                raise RuntimeError("injected engine failure")
            if self.hang.is_set():
                self.hanging.set()
                self.release.wait(30)
                self.hang.clear()
            return inner()

        return step


def unfinished(srv) -> int:
    return srv.engine.output_processor.get_num_unfinished_requests()


def test_crash_fails_in_flight_requests_with_503s(server_factory) -> None:
    # A grace period far longer than the test: everything below runs before the exit.
    srv = server_factory(core_factory=FaultyCore, app_kwargs={"engine_death_grace": 600.0})
    core = srv.engine.engine_core.proc.engine_core
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        assert http.get("/health").status_code == 200
        result: dict[str, httpx.Response] = {}

        def non_streamed() -> None:
            with httpx.Client(base_url=srv.base_url, timeout=30) as other:
                result["resp"] = other.post("/v1/completions", json=LONG)

        waiter = threading.Thread(target=non_streamed)
        frames: list[str] = []
        with http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
            lines = r.iter_lines()
            for line in lines:  # the stream is running
                if line.startswith("data: "):
                    frames.append(line)
                    break
            waiter.start()
            wait_until(lambda: unfinished(srv) == 2, "both requests in the engine")
            # The gauge follows the scheduler's stats of the last step: wait for a step with both.
            wait_until(
                lambda: metric(scrape(http), "cadence:num_requests_running") == 2,
                "both requests running",
            )
            core.armed.set()
            frames += [line for line in lines if line.startswith("data: ")]
        waiter.join(30)
        # The stream ends with a 503 error event, then [DONE]; no chunk claims a finish.
        assert frames[-1] == "data: [DONE]"
        err = json.loads(frames[-2][6:])["error"]
        assert err["code"] == 503 and err["type"] == "ServiceUnavailableError"
        assert "engine" in err["message"].lower()
        for frame in frames[:-2]:
            assert json.loads(frame[6:])["choices"][0]["finish_reason"] is None
        # The waiting non-streamed request gets a 503 JSON error.
        resp = result["resp"]
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["type"] == "ServiceUnavailableError"
        # Health says so; new requests are refused with 503 at once; metrics claim nothing.
        assert http.get("/health").status_code == 503
        for route, body in (
            ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ):
            for stream in (False, True):
                resp = http.post(route, json={**body, "stream": stream})
                assert resp.status_code == 503, resp.text
                assert resp.json()["error"]["code"] == 503
        text = scrape(http)
        assert metric(text, "cadence:num_requests_running") == 0
        assert metric(text, "cadence:num_requests_waiting") == 0
        assert metric(text, "cadence:kv_cache_usage_perc") == 0
    # The exit with status 1 is decided (at the server's next tick); it comes after the grace.
    wait_until(lambda: srv.server.exit_code == 1, "the server to decide its exit")
    assert srv.thread.is_alive()


def test_after_an_engine_crash_the_server_exits_with_status_1(server_factory) -> None:
    srv = server_factory(core_factory=FaultyCore, app_kwargs={"engine_death_grace": 0.0})
    core = srv.engine.engine_core.proc.engine_core
    core.armed.set()
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        resp = http.post("/v1/completions", json={**LONG, "max_tokens": 4})
    assert resp.status_code == 503, resp.text
    srv.thread.join(30)  # a bound only: the grace period is 0
    assert not srv.thread.is_alive()
    assert srv.server.exit_code == 1


def test_stall_turns_health_503_until_progress(server_factory, caplog) -> None:
    caplog.set_level(logging.INFO, logger="cadence.server.watchdog")
    srv = server_factory(core_factory=FaultyCore, app_kwargs={"engine_stall_timeout": 1.0})
    core = srv.engine.engine_core.proc.engine_core
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        assert http.get("/health").status_code == 200
        body = {**LONG, "max_tokens": 20}
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert first
            core.hang.set()
            assert core.hanging.wait(30)
            health = wait_until(
                lambda: (h := http.get("/health")).status_code == 503 and h, "a 503 /health"
            )
            reason = health.json()["error"]["message"]
            assert "stalled" in reason and "1 unfinished request" in reason
            logged = [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]
            assert len(logged) == 1, logged
            core.release.set()
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
        assert http.get("/health").status_code == 200
        assert any("again" in r.getMessage() for r in caplog.records)


def test_clean_shutdown(server_factory) -> None:
    srv = server_factory()
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        ok = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert ok.status_code == 200
    srv.stop()
    assert not srv.thread.is_alive()
    assert srv.server.exit_code == 0
    assert not srv.engine.engine_core.proc.thread.is_alive()
    assert srv.engine.errored


class RequestFailingCore(GatedCore):
    """A gated core that fails the requests named in ``to_fail`` at its next step, as the
    model runner does with a request it cannot run: that request alone ends with an error."""

    def __init__(self, args: EngineArgs) -> None:
        super().__init__(args)
        self.to_fail: set[str] = set()

    @property
    def step_fn(self):
        inner = super().step_fn

        def step():
            outputs, executed = inner()
            failing = {rid: "injected request failure" for rid in self.to_fail
                       if rid in self.scheduler.requests}
            if failing:
                outputs.outputs.extend(self.scheduler._fail_requests(failing))
            return outputs, executed

        return step


def test_a_request_failing_after_its_stream_started_ends_with_an_error_event(
    server_factory,
) -> None:
    srv = server_factory(core_factory=RequestFailingCore)
    core: RequestFailingCore = srv.engine.engine_core.proc.engine_core
    body = {**LONG, "stream": True, "return_token_ids": True}
    try:
        with httpx.Client(base_url=srv.base_url, timeout=30) as http:
            with http.stream("POST", "/v1/completions", json=body) as r:
                frames = (line for line in r.iter_lines() if line.startswith("data: "))
                core.allow(2)
                first = [json.loads(next(frames)[6:]) for _ in range(2)]
                rid = first[0]["id"]
                core.wait_at_gate(2)
                core.to_fail = {rid}
                core.open()
                rest = list(frames)
            # Every token the engine made (the failing step's too) in chunks that claim no
            # finish, then the error event, then [DONE].
            assert rest[-1] == "data: [DONE]"
            chunks = first + [json.loads(line[6:]) for line in rest[:-2]]
            assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
            assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == core.tokens[rid] == 3
            err = json.loads(rest[-2][6:])["error"]
            assert (err["code"], err["type"]) == (500, "InternalServerError")
            assert rid in err["message"] and "injected request failure" in err["message"]
            # The engine serves on.
            resp = http.post("/v1/completions", json={**LONG, "max_tokens": 4})
            assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4
            assert http.get("/health").status_code == 200
        wait_released(srv.engine)
    finally:
        core.open()


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_no_usage_chunk_follows_an_error_frame(server_factory, route: str) -> None:
    """stream_options.include_usage with a request that fails mid-stream: the error frame is
    the last before [DONE]; no usage chunk comes (a stream that ends well does get it)."""
    srv = server_factory(core_factory=RequestFailingCore)
    core: RequestFailingCore = srv.engine.engine_core.proc.engine_core
    body: dict = {"max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True,
                  "stream_options": {"include_usage": True}}
    if route == "/v1/completions":
        body["prompt"] = PROMPT
    else:
        body["messages"] = [{"role": "user", "content": PROMPT}]

    def frames(http: httpx.Client, fail: bool) -> list:
        with http.stream("POST", route, json=body) as r:
            assert r.status_code == 200
            lines = (line for line in r.iter_lines() if line.startswith("data: "))
            if fail:
                core.allow(2)
                core.wait_at_gate(2)  # two steps of this request went through
                core.to_fail = set(core.scheduler.requests)
                core.open()
            rest = list(lines)
        assert rest[-1] == "data: [DONE]"
        return [json.loads(line[6:]) for line in rest[:-1]]

    try:
        with httpx.Client(base_url=srv.base_url, timeout=30) as http:
            failed = frames(http, fail=True)
            assert "error" in failed[-1]
            assert all("error" not in f and f["choices"] for f in failed[:-1])
            core.to_fail = set()
            body["max_tokens"] = 4
            ok = frames(http, fail=False)
            assert ok[-1]["choices"] == [] and ok[-1]["usage"]["completion_tokens"] == 4
        wait_released(srv.engine)
    finally:
        core.open()


def test_a_failing_responses_stream_ends_with_response_failed(server_factory) -> None:
    """Through the openai client's stream helper: the deltas, the error event, then
    ``response.failed`` whose response is failed, holds the message cut where the deltas
    stopped, and carries OpenAI's error object; the engine serves on."""
    srv = server_factory(core_factory=RequestFailingCore)
    core: RequestFailingCore = srv.engine.engine_core.proc.engine_core
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    try:
        with client.responses.stream(model="tiny", input=PROMPT, max_output_tokens=400,
                                     temperature=0, extra_body={"ignore_eos": True}) as stream:
            events = iter(stream)
            core.allow(3)
            seen = [next(events) for _ in range(4)]  # created, in_progress, item, part
            assert [e.type for e in seen][:2] == ["response.created", "response.in_progress"]
            core.wait_at_gate(3)
            core.to_fail = set(core.scheduler.requests)
            core.open()
            rest = list(events)
        kinds = [e.type for e in rest]
        assert kinds[-2:] == ["error", "response.failed"] and "response.completed" not in kinds
        assert "injected request failure" in rest[-2].message
        failed = rest[-1].response
        assert failed.status == "failed" and failed.error.code == "server_error"
        assert "injected request failure" in failed.error.message and failed.usage is None
        text = "".join(e.delta for e in rest if e.type == "response.output_text.delta")
        assert text  # some of the answer came before the failure
        (item,) = failed.output
        assert item.type == "message" and item.status == "incomplete"
        assert item.content[0].text == text
        numbers = [e.sequence_number for e in seen + rest]
        assert numbers == list(range(len(numbers)))
        with pytest.raises(RuntimeError, match="response.completed"):
            stream.get_final_response()  # the helper's own word for a stream that failed
        core.to_fail = set()
        answer = client.responses.create(model="tiny", input=PROMPT, max_output_tokens=4)
        assert answer.status == "incomplete" and answer.usage.output_tokens == 4
        wait_released(srv.engine)
    finally:
        core.open()

