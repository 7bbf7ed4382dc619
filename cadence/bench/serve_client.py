"""The load generator of ``cadence bench serve``: streaming completion requests over aiohttp.

A run is a list of ``Send`` (payload, prompt length, arrival offset) driven at once with at most
``cap`` in flight. ``run_requests`` does it in this process; ``run_in_processes`` splits the sends
over several client processes that start at one shared moment, so that the client itself is not
what limits a run of hundreds of streams (each process has its own interpreter and event loop).

aiohttp rather than httpx: its connection pool and line reader cost a fraction of httpx's per
request and per chunk, which matters at 256+ concurrent streams (vLLM's benchmark uses it too).
"""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

__all__ = ["RequestResult", "Send", "run_in_processes", "run_requests"]


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True)
class Send:
    """One request: its JSON payload, its prompt length and when it is sent (seconds from the
    start of the run)."""

    payload: dict[str, Any]
    prompt_len: int
    offset: float = 0.0


@dataclass(frozen=True)
class Target:
    url: str
    headers: dict[str, str]
    timeout: float


async def run_one(
    session: aiohttp.ClientSession, target: Target, send: Send
) -> RequestResult:
    """Send one streaming request and time every content chunk."""
    result = RequestResult(ok=False, prompt_len=send.prompt_len)
    start = last = time.perf_counter()
    chunks = 0
    try:
        async with session.post(target.url, json=send.payload) as resp:
            if resp.status != 200:
                body = await resp.read()
                result.error = f"HTTP {resp.status}: {body[:200]!r}"
                return result
            async for raw in resp.content:  # one SSE line at a time
                if not raw.startswith(b"data:"):
                    continue
                data = raw[5:].strip()
                if data == b"[DONE]":
                    break
                if not data:
                    continue
                msg = json.loads(data)
                if "error" in msg:
                    result.error = str(msg["error"])
                    return result
                if msg.get("usage"):
                    result.output_tokens = msg["usage"].get("completion_tokens", 0)
                    # The server's count of the prompt (a text prompt's words are not tokens).
                    result.prompt_len = msg["usage"].get("prompt_tokens") or result.prompt_len
                choices = msg.get("choices") or []
                if not choices or not (choices[0].get("text") or choices[0].get("token_ids")):
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
                chunks += 1
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
        result.error = repr(exc)
        return result
    result.latency = time.perf_counter() - start
    if result.output_tokens == 0:
        result.output_tokens = chunks  # the endpoint gave no usage: one token per chunk
    result.ok = chunks > 0
    return result


async def run_requests(
    target: Target, sends: list[Send], cap: int, start_at: float | None = None
) -> tuple[list[RequestResult], float, float]:
    """Drive ``sends`` with at most ``cap`` in flight, each at its offset from ``start_at``
    (a ``time.monotonic()`` moment; now if None). Returns the results (in order) and the
    monotonic start and end of the run."""
    connector = aiohttp.TCPConnector(limit=cap, limit_per_host=cap, force_close=False)
    timeout = aiohttp.ClientTimeout(total=target.timeout)
    sem = asyncio.Semaphore(cap)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=target.headers
    ) as session:
        if start_at is not None and start_at > time.monotonic():
            await asyncio.sleep(start_at - time.monotonic())
        start = time.monotonic()

        async def one(send: Send) -> RequestResult:
            delay = start + send.offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # the request's arrival time
            async with sem:
                return await run_one(session, target, send)

        results = await asyncio.gather(*(one(s) for s in sends))
        end = time.monotonic()
    return list(results), start, end


def _ignore_interrupts() -> None:
    # NOTE: Ctrl-C reaches the whole foreground process group; the parent alone answers it (it
    # ends the pool), so a worker's interrupted event loop does not print its own traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _worker(args: tuple[Target, list[Send], int, float]) -> tuple[list[dict], float, float]:
    target, sends, cap, start_at = args
    results, start, end = asyncio.run(run_requests(target, sends, cap, start_at))
    return [asdict(r) for r in results], start, end


def run_in_processes(
    target: Target, sends: list[Send], cap: int, processes: int
) -> tuple[list[RequestResult], float]:
    """``run_requests`` split over ``processes`` client processes (round-robin, each with its
    share of ``cap``), all starting at one moment; returns the results in the order of
    ``sends`` and the run's duration (first start to last end)."""
    processes = max(1, min(processes, cap, len(sends)))  # each process keeps >= 1 in flight
    caps = [cap // processes + (1 if i < cap % processes else 0) for i in range(processes)]
    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(processes, initializer=_ignore_interrupts)
    interrupted = False
    try:
        # Workers import aiohttp and build their loop first; the shared start leaves them time.
        start_at = time.monotonic() + 1.0 + 0.2 * processes
        jobs = [(target, sends[i::processes], caps[i], start_at)
                for i in range(processes)]
        parts = pool.map(_worker, jobs)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        pool.terminate()
        pool.join()
    if interrupted:
        # NOTE: an interrupted command ends by os._exit (cli.main), which runs no finalizers:
        # the pool's semaphores are released here, outside the handler (whose traceback holds
        # the pool), or the resource tracker reports them as leaked after the last line.
        del pool
        gc.collect()
        raise KeyboardInterrupt
    results: list[RequestResult | None] = [None] * len(sends)
    for i, (rows, _, _) in enumerate(parts):
        for j, row in enumerate(rows):
            results[i + j * processes] = RequestResult(**row)
    start = min(p[1] for p in parts)
    end = max(p[2] for p in parts)
    return [r for r in results if r is not None], end - start
