"""Streaming is real (each chunk leaves as its token is ready) and a vanished client frees its
request. The engine is gated (``tests.gated_core``): tests hand out steps one by one, so what
the client has seen is checked against how many steps the engine was allowed, not the clock."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gated_core import GatedCore
from tests.server.waiting import wait_released, wait_until

PROMPT = "Hello my name is Robert and"
# Far longer than any test lets the engine run: the request is still running when it is dropped.
LONG_COMPLETION = {
    "model": "tiny",
    "prompt": PROMPT,
    "max_tokens": 400,
    "temperature": 0.0,
    "ignore_eos": True,
}


def gated(srv) -> GatedCore:
    return srv.engine.engine_core.proc.engine_core


@pytest.fixture
def gated_server(server_factory, request: pytest.FixtureRequest) -> Iterator[Any]:
    srv = server_factory(core_factory=GatedCore, **getattr(request, "param", {}))
    try:
        yield srv
    finally:
        gated(srv).open()  # a test that failed half-way must not leave the engine blocked


def data_lines(lines: Iterator[str]) -> Iterator[str]:
    return (line for line in lines if line.startswith("data: "))


def test_each_token_reaches_the_client_before_the_next_is_computed(gated_server) -> None:
    core = gated(gated_server)
    n = 12
    body = {**LONG_COMPLETION, "max_tokens": n, "stream": True, "return_token_ids": True}
    streamed: list[int] = []
    with httpx.Client(base_url=gated_server.base_url, timeout=20) as http:
        with http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            frames = data_lines(r.iter_lines())
            for k in range(1, n + 1):
                # One step per token (synchronous scheduling, a one-step prefill): chunk k can
                # only be read here if the server sent it while the engine waits at step k + 1.
                core.allow()
                chunk = json.loads(next(frames)[6:])
                (choice,) = chunk["choices"]
                streamed += choice["token_ids"]
                assert len(streamed) == k and core.steps == k
                assert choice["finish_reason"] == ("length" if k == n else None)
            assert next(frames) == "data: [DONE]"
        core.open()
        whole = http.post("/v1/completions", json={**body, "stream": False}).json()
    assert streamed == whole["choices"][0]["token_ids"]


def test_32_concurrent_streams_all_start_before_any_completes(gated_server) -> None:
    core = gated(gated_server)
    srv = gated_server
    num, max_tokens = 32, 64
    first_seen: set[int] = set()
    done: set[int] = set()
    all_started = asyncio.Event()

    async def one(i: int, http: httpx.AsyncClient) -> int:
        body = {**LONG_COMPLETION, "prompt": f"{PROMPT} {i}", "max_tokens": max_tokens,
                "stream": True, "return_token_ids": True}
        n = 0
        async with http.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                got = len(json.loads(line[6:])["choices"][0]["token_ids"])
                if got and not n:
                    assert not done, f"stream {i} started after {sorted(done)} completed"
                    first_seen.add(i)
                    if len(first_seen) == num:
                        all_started.set()
                n += got
        done.add(i)
        return n

    async def main() -> list[int]:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as http:
            tasks = [asyncio.ensure_future(one(i, http)) for i in range(num)]
            # Every request is in the engine's queue before the engine may take a step.
            while srv.engine.output_processor.get_num_unfinished_requests() < num:
                assert not any(t.done() for t in tasks), [t for t in tasks if t.done()]
                await asyncio.sleep(0.005)
            # Two steps: the first admits what arrived before it (at least one request), the
            # second everything else; every stream then has its first token, none its last.
            core.allow(2)
            await asyncio.wait_for(all_started.wait(), 30)
            assert core.steps == 2 and not done
            core.open()
            return await asyncio.gather(*tasks)

    assert asyncio.run(main()) == [max_tokens] * num


@pytest.mark.parametrize("gated_server", [{"async_scheduling": False},
                                          {"async_scheduling": True}],
                         indirect=True, ids=["sync", "async"])
def test_client_disconnect_aborts_the_request_and_frees_its_blocks(gated_server) -> None:
    srv = gated_server
    core = gated(srv)
    async_scheduling = bool(srv.engine.args.async_scheduling)
    body = {**LONG_COMPLETION, "stream": True, "return_token_ids": True}
    # Asynchronous scheduling: the first step only launches a batch, tokens come one step later.
    steps = 5 + async_scheduling
    with httpx.Client(base_url=srv.base_url, timeout=20) as http:
        with http.stream("POST", "/v1/completions", json=body) as r:
            frames = data_lines(r.iter_lines())  # kept: dropping it would close the connection
            core.allow(steps)
            seen = 0
            while seen < 5:
                chunk = json.loads(next(frames)[6:])
                seen += len(chunk["choices"][0]["token_ids"])
            core.wait_at_gate(steps)
            assert seen == 5 and srv.engine.output_processor.get_num_unfinished_requests() == 1
        # Leaving the blocks closed the connection mid-stream, while the engine waits.
    wait_until(lambda: not srv.engine.output_processor.has_unfinished_requests(),
               "the server to notice the disconnect")
    core.open()
    wait_released(srv.engine)
    # The abort was queued before the engine went on: the request got at most the token of the
    # step the engine was waiting to run (and of the batch in flight), far from 400.
    assert 5 <= core.tokens[chunk["id"]] <= 6 + async_scheduling, core.tokens


def test_disconnect_while_waiting_for_a_non_streamed_answer(gated_server) -> None:
    srv = gated_server
    core = gated(srv)
    raw = json.dumps(LONG_COMPLETION).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as sock:
        sock.sendall(head + raw)
        core.allow(3)
        core.wait_at_gate(3)  # the request runs: 3 tokens, 397 to go
        assert srv.engine.output_processor.get_num_unfinished_requests() == 1
        (rid,) = core.tokens
        assert core.tokens[rid] == 3
    wait_until(lambda: not srv.engine.output_processor.has_unfinished_requests(),
               "the server to notice the disconnect")
    core.open()
    wait_released(srv.engine)
    assert core.tokens[rid] <= 4


def test_sse_frames_format(server) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        # UTF-8 named, as OpenAI's and vLLM's: a client that takes a text/* type without a
        # charset for Latin-1 (requests does) would garble the non-ASCII text of the events.
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        # As OpenAI's streams: no cache between the client and the server may hold the events.
        assert r.headers["cache-control"] == "no-cache"
        raw = r.read().decode()
    frames = raw.split("\n\n")
    assert frames[-1] == "" and frames[-2] == "data: [DONE]"
    for frame in frames[:-2]:
        assert frame.startswith("data: {")
        chunk = json.loads(frame[6:])
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["choices"][0]["index"] == 0
    first = json.loads(frames[0][6:])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    later = [json.loads(f[6:]) for f in frames[1:-2]]
    assert all("role" not in c["choices"][0]["delta"] for c in later)


def test_the_servers_stream_interval_sends_fewer_larger_chunks(server_factory) -> None:
    """--stream-interval 4: a streamed completion's text comes in chunks of about four tokens
    (the first token alone; never more chunks than 1 + ceil((n - 1) / 4)), and joins up to the
    same greedy text as a server streaming every token; a request's own stream_interval (vLLM's
    field) does the same on a server streaming every token."""
    import json
    import math

    import httpx

    body = {"prompt": "Hello", "max_tokens": 13, "temperature": 0, "ignore_eos": True,
            "stream": True}

    def chunks(srv) -> list[str]:
        texts = []
        with httpx.Client(base_url=srv.base_url, timeout=60) as http, \
                http.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    choice = json.loads(line[6:])["choices"][0]
                    if choice["text"]:
                        texts.append(choice["text"])
        return texts

    plain = server_factory()
    every = chunks(plain)
    grouped_srv = server_factory(stream_interval=4)
    grouped = chunks(grouped_srv)
    assert "".join(grouped) == "".join(every)
    assert len(grouped) <= 1 + math.ceil((13 - 1) / 4)
    # The request's own stream_interval (vLLM's field) raises the server's, never lowers it.
    body["stream_interval"] = 6
    own = chunks(plain)
    assert "".join(own) == "".join(every) and len(own) <= 1 + math.ceil((13 - 1) / 6)
    body["stream_interval"] = 1
    assert len(chunks(grouped_srv)) <= 1 + math.ceil((13 - 1) / 4)
    with httpx.Client(base_url=plain.base_url, timeout=60) as http:
        bad = http.post("/v1/completions", json={**body, "stream_interval": 0})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "stream_interval"


# -- run_until_disconnect alone (no server) ------------------------------------------------


async def test_cancelling_the_waiter_cancels_the_work() -> None:
    """A handler cancelled while it waits (its connection's task ended) must not leave the work
    it waited for running on: that work holds engine requests."""
    from cadence.server.sse import run_until_disconnect

    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.ensure_future(work())
    waiter = asyncio.ensure_future(run_until_disconnect(task, None, asyncio.Event()))
    await started.wait()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    for _ in range(3):  # the work's cancellation is delivered at its next step
        await asyncio.sleep(0)
    assert task.cancelled()


async def test_work_done_when_the_stop_comes_is_still_answered() -> None:
    """The stop and the answer in the same turn of the loop: the answer is complete, so it is
    returned (a 503 would throw a finished answer away)."""
    from cadence.server.sse import run_until_disconnect

    stop = asyncio.Event()
    stop.set()
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    answer.set_result("complete")
    assert await run_until_disconnect(answer, None, stop) == "complete"
