"""128 streams at once: every stream gets all its tokens, in order, and its deltas concatenate to
the text a non-streamed request gets; the engine ends idle."""

from __future__ import annotations

import asyncio
import json
import random

import httpx

from tests.server.conftest import start_server, tiny_args

STREAMS = 128
MAX_TOKENS = 12


async def _stream(client: httpx.AsyncClient, prompt: list[int]) -> tuple[str, list[int], dict]:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True, "stream_options": {"include_usage": True}}
    text, ids, usage, done = "", [], {}, False
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            assert "error" not in chunk, chunk
            if chunk["choices"]:
                text += chunk["choices"][0]["text"]
                ids += chunk["choices"][0]["token_ids"]
            else:
                usage = chunk["usage"]
    assert done
    return text, ids, usage


def test_128_streams_lose_nothing_and_keep_order() -> None:
    from cadence.engine.async_llm import AsyncLLM

    srv = start_server(AsyncLLM(tiny_args(max_num_seqs=STREAMS, num_gpu_blocks_override=1200,
                                          async_scheduling=True)))
    rng = random.Random(5)
    prompts = [[rng.randrange(40, 250) for _ in range(rng.randrange(4, 20))]
               for _ in range(STREAMS)]

    async def main() -> list[tuple[str, list[int], dict]]:
        limits = httpx.Limits(max_connections=STREAMS)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=120, limits=limits) as c:
            return await asyncio.gather(*(_stream(c, p) for p in prompts))

    try:
        results = asyncio.run(main())
        with httpx.Client(base_url=srv.base_url, timeout=60) as http:
            for prompt, (text, ids, _) in zip(prompts[:16], results, strict=False):
                ref = http.post("/v1/completions", json={
                    "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                    "ignore_eos": True, "return_token_ids": True}).json()["choices"][0]
                assert ids == ref["token_ids"] and text == ref["text"]
        for prompt, (_, ids, usage) in zip(prompts, results, strict=True):
            assert len(ids) == MAX_TOKENS
            assert usage == {"prompt_tokens": len(prompt), "completion_tokens": MAX_TOKENS,
                             "total_tokens": len(prompt) + MAX_TOKENS}
        stats = srv.engine.engine_core.call_utility("make_stats")
        assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
        assert not srv.engine.output_processor.has_unfinished_requests()
    finally:
        srv.stop()
