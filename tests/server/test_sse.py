"""Streaming is real (chunks as tokens are ready) and a vanished client frees its request."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

PROMPT = "Hello my name is Robert and"
# Far longer than any test waits for: the request is still running when it is dropped.
LONG_COMPLETION = {
    "model": "tiny",
    "prompt": PROMPT,
    "max_tokens": 400,
    "temperature": 0.0,
    "ignore_eos": True,
}


def engine_stats(server):
    return server.engine.engine_core.call_utility("make_stats")


def wait_idle(server, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        stats = engine_stats(server)
        if stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0:
            return stats
        assert time.monotonic() < deadline, f"engine still busy: {stats}"
        time.sleep(0.01)


def free_kv_blocks(server) -> int:
    return server.engine.engine_core.call_utility("num_free_kv_blocks")


def assert_released(server, free_before: int) -> None:
    """Once the engine is idle, every KV block is free again and no request is left."""
    wait_idle(server)
    assert free_kv_blocks(server) == free_before
    assert not server.engine.output_processor.has_unfinished_requests()


def test_chunks_arrive_as_tokens_are_generated(server) -> None:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    start = time.monotonic()
    arrivals: list[float] = []
    stream = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=120,
        temperature=0.0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.monotonic() - start)
    done = time.monotonic() - start
    assert len(arrivals) >= 30  # merged deltas are allowed, one final blob is not
    first, last = arrivals[0], arrivals[-1]
    assert first < 0.5 * done, (first, done)
    # Spread over the generation: every quarter of [first, last] received chunks.
    span = last - first
    quarters = {min(int(4 * (t - first) / span), 3) for t in arrivals}
    assert quarters == {0, 1, 2, 3}


def test_32_concurrent_streams_all_start_before_any_completes(server) -> None:
    async def main() -> list[tuple[float, float]]:
        client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)

        async def one(i: int) -> tuple[float, float]:
            first = None
            stream = await client.completions.create(
                model="tiny",
                prompt=f"{PROMPT} {i}",
                max_tokens=64,
                temperature=0.0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            n = 0
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    if first is None:
                        first = time.monotonic()
                    n += 1
            assert first is not None and n > 1
            return first, time.monotonic()

        try:
            return await asyncio.gather(*(one(i) for i in range(32)))
        finally:
            await client.close()

    times = asyncio.run(main())
    last_first_chunk = max(f for f, _ in times)
    first_completion = min(d for _, d in times)
    assert last_first_chunk < first_completion


def count_engine_tokens(server, monkeypatch) -> dict[str, int]:
    """Tokens the engine core produced per request, as they reach the front end."""
    counts: dict[str, int] = {}
    client = server.engine.engine_core
    inner = client.get_output_async

    async def counting():
        outputs = await inner()
        for o in outputs.outputs:
            counts[o.request_id] = counts.get(o.request_id, 0) + len(o.new_token_ids)
        return outputs

    monkeypatch.setattr(client, "get_output_async", counting)
    return counts


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_client_disconnect_aborts_the_request_and_frees_its_blocks(
    server, server_factory, monkeypatch, async_scheduling: bool
) -> None:
    if async_scheduling:
        server = server_factory(async_scheduling=True)
    free_before = free_kv_blocks(server)
    body = {**LONG_COMPLETION, "stream": True}
    # Make sure the handler picks the counting wrapper up before the request starts.
    httpx.post(server.base_url + "/v1/completions", json={**body, "stream": False, "max_tokens": 1})
    counts = count_engine_tokens(server, monkeypatch)
    httpx.post(server.base_url + "/v1/completions", json={**body, "stream": False, "max_tokens": 1})
    chunks = 0
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", server.base_url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()  # kept: dropping it would close the connection here
            for line in lines:
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    chunks += 1
                if chunks >= 5:
                    break
            assert engine_stats(server).num_running_reqs == 1
            rid = chunk["id"]
            at_close = counts[rid]  # tokens the engine had produced for it by now
        # Leaving the blocks closes the connection mid-stream.
    assert_released(server, free_before)
    # The engine stopped within a few steps of the disconnect, far from the 400 tokens.
    assert at_close <= counts[rid] < at_close + 40, (at_close, counts[rid])


def test_disconnect_while_waiting_for_a_non_streamed_answer(server) -> None:
    free_before = free_kv_blocks(server)
    try:
        httpx.post(server.base_url + "/v1/completions", json=LONG_COMPLETION, timeout=0.3)
    except httpx.TimeoutException:
        pass
    else:
        raise AssertionError("the request should still have been running")
    assert_released(server, free_before)


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
        assert r.headers["content-type"].startswith("text/event-stream")
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
