"""AsyncLLM and event loops: its outputs are collected in the loop it first ran in. A request
from another loop is served while that loop runs (in another thread), and refused, not left
waiting for ever, while it does not."""

from __future__ import annotations

import asyncio
import threading

import pytest

from cadence.engine import AsyncLLM
from cadence.sampling_params import SamplingParams
from tests.tiny import tiny_args

PARAMS = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)


async def _finish(llm: AsyncLLM, request_id: str) -> str | None:
    last = None
    async for out in llm.generate("Hello", PARAMS, request_id):
        last = out
    assert last is not None and last.finished
    return last.outputs[0].finish_reason


def test_a_loop_that_is_not_running_is_named_not_waited_on() -> None:
    llm = AsyncLLM(tiny_args(max_model_len=256))
    first = asyncio.new_event_loop()
    try:
        assert first.run_until_complete(_finish(llm, "warm")) == "length"
        # The first loop stays open but idle (as after get_event_loop().run_until_complete).

        async def elsewhere() -> None:
            with pytest.raises(RuntimeError, match="event loop it first ran in, which is not "
                                                   "running"):
                await _finish(llm, "elsewhere")

        asyncio.run(elsewhere())
        # Nothing of the refused request is left, and the first loop still serves.
        assert not llm.has_unfinished_requests()
        assert first.run_until_complete(_finish(llm, "again")) == "length"
        stats = first.run_until_complete(llm.get_scheduler_stats())
        assert stats.num_running_reqs == stats.num_waiting_reqs == 0
        assert stats.kv_cache_usage == 0.0
    finally:
        llm.shutdown()
        first.close()


def test_a_closed_first_loop_is_named() -> None:
    llm = AsyncLLM(tiny_args(max_model_len=256))
    first = asyncio.new_event_loop()
    try:
        first.run_until_complete(_finish(llm, "warm"))
        first.close()  # its output handler is never cancelled: the loop is just gone

        async def elsewhere() -> None:
            with pytest.raises(RuntimeError, match="which is closed"):
                await _finish(llm, "elsewhere")

        asyncio.run(elsewhere())
    finally:
        llm.shutdown()


def test_a_request_from_another_threads_loop_is_served_while_the_first_runs() -> None:
    llm = AsyncLLM(tiny_args(max_model_len=256))
    first = asyncio.new_event_loop()
    started = threading.Event()
    thread = threading.Thread(target=first.run_forever, daemon=True)
    try:
        first.call_soon(started.set)
        thread.start()
        assert started.wait(60)
        warm = asyncio.run_coroutine_threadsafe(_finish(llm, "warm"), first)
        assert warm.result(120) == "length"
        # This thread's loop, the first one running in its own thread: outputs cross over.
        assert asyncio.run(_finish(llm, "other")) == "length"
    finally:
        first.call_soon_threadsafe(first.stop)
        thread.join(60)
        llm.shutdown()
        first.close()
