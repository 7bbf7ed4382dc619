"""A load test with random client disconnects, streaming and not: no 5xx, one INFO line per
aborted request and no tracebacks, and afterwards nothing runs, waits or holds a KV block."""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from typing import Any

import httpx
import openai

from tests.server.waiting import metric, scrape, wait_released

NUM_REQUESTS = 96
CONCURRENCY = 16
SEED = 20261130


class TokenCounter:
    """A stat logger that counts generated tokens (the clients' clock)."""

    def __init__(self) -> None:
        self.tokens = 0

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if iteration_stats is not None:
            self.tokens += iteration_stats.num_generation_tokens


async def _wait_tokens(counter: TokenCounter, target: int) -> None:
    while counter.tokens < target:
        await asyncio.sleep(0.002)


def test_load_with_random_disconnects(server_factory, caplog) -> None:
    caplog.set_level(logging.INFO)
    srv = server_factory(async_scheduling=True, max_num_seqs=8)
    counter = TokenCounter()
    srv.engine.add_stat_logger(counter)
    rng = random.Random(SEED)
    plan = [
        {
            "stream": rng.random() < 0.5,
            "disconnect": rng.random() < 0.4,
            "max_tokens": rng.randint(8, 48),
            "after": rng.randint(1, 6),
            "chat": rng.random() < 0.3,
        }
        for _ in range(NUM_REQUESTS)
    ]
    outcome: Counter[str] = Counter()

    async def one(i: int, p: dict[str, Any], http: httpx.AsyncClient, sdk: openai.AsyncOpenAI):
        if p["chat"]:
            route = "/v1/chat/completions"
            body: dict[str, Any] = {"messages": [{"role": "user", "content": f"Tell me {i}"}]}
        else:
            route, body = "/v1/completions", {"prompt": f"Once upon a time {i}"}
        body |= {"max_tokens": p["max_tokens"], "ignore_eos": True, "temperature": 0.8,
                 "seed": i, "stream": p["stream"]}
        if p["stream"] and p["disconnect"]:
            async with http.stream("POST", route, json=body) as resp:
                assert resp.status_code == 200
                seen = 0
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        seen += 1
                        if seen >= p["after"]:
                            break  # leaving the block closes the connection mid-stream
            outcome["stream disconnected"] += 1
        elif p["disconnect"]:
            task = asyncio.ensure_future(http.post(route, json=body))
            await _wait_tokens(counter, counter.tokens + p["after"])
            task.cancel()
            try:
                resp = await task
                assert resp.status_code == 200, resp.text  # it finished first
                outcome["finished before the disconnect"] += 1
            except asyncio.CancelledError:
                outcome["disconnected"] += 1
        elif p["stream"]:
            extra = {"ignore_eos": True}
            kwargs = dict(model="tiny", max_tokens=p["max_tokens"], temperature=0.8, seed=i,
                          stream=True, extra_body=extra)
            if p["chat"]:
                stream = await sdk.chat.completions.create(messages=body["messages"], **kwargs)
            else:
                stream = await sdk.completions.create(prompt=body["prompt"], **kwargs)
            reasons = [c.choices[0].finish_reason async for c in stream if c.choices]
            assert reasons[-1] == "length" and set(reasons[:-1]) <= {None}
            outcome["streamed"] += 1
        else:
            resp = await http.post(route, json=body)
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["completion_tokens"] == p["max_tokens"]
            outcome["completed"] += 1

    async def main() -> None:
        limits = httpx.Limits(max_connections=CONCURRENCY * 2)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60, limits=limits) as http:
            sdk = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
            gate = asyncio.Semaphore(CONCURRENCY)

            async def bounded(i: int, p: dict[str, Any]) -> None:
                async with gate:
                    await one(i, p, http, sdk)

            await asyncio.gather(*(bounded(i, p) for i, p in enumerate(plan)))
            await sdk.close()

    asyncio.run(main())
    disconnects = outcome["stream disconnected"] + outcome["disconnected"]
    print(f"\nload: {NUM_REQUESTS} requests, outcomes {dict(outcome)}")
    assert disconnects >= NUM_REQUESTS // 5

    wait_released(srv.engine)
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        assert http.get("/health").status_code == 200
        text = scrape(http)
    assert metric(text, "cadence:num_requests_running") == 0
    assert metric(text, "cadence:num_requests_waiting") == 0
    assert metric(text, "cadence:kv_cache_usage_perc") == 0
    aborted = metric(text, "cadence:request_success_total", finished_reason="abort")
    finished = metric(text, "cadence:request_success_total", finished_reason="length")
    print(f"load: request_success_total abort={aborted:g} length={finished:g}")
    assert 1 <= aborted <= disconnects
    assert finished + aborted <= NUM_REQUESTS
    assert finished >= NUM_REQUESTS - disconnects
    # Quiet: one INFO line per aborted request at most, and no error or traceback at all.
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert noisy == [], [r.getMessage() for r in noisy]
    lines = [r for r in caplog.records if "disconnected" in r.getMessage()]
    assert len(lines) <= disconnects
