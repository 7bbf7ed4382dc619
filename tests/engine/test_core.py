"""EngineCore on its own (no thread): the depth-2 batch queue of async scheduling, work left in
flight, the core's own admission checks, and the arrival time a request brings with it."""

from __future__ import annotations

from typing import Any

import pytest

from cadence.core_types import EngineCoreOutputs, EngineCoreRequest
from cadence.engine.core import EngineCore
from cadence.sampling_params import SamplingParams
from tests.tiny import tiny_args

PROMPT = [72, 101, 278, 111, 295, 121, 290, 346]
NUM_BLOCKS = 64


def make_core(**kw: Any) -> EngineCore:
    return EngineCore(tiny_args(max_model_len=128, num_gpu_blocks_override=NUM_BLOCKS, **kw))


def request(rid: str, max_tokens: int = 4, **kw: Any) -> EngineCoreRequest:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    return EngineCoreRequest(rid, list(PROMPT), params, eos_token_id=None, **kw)


def tokens_of(outs: EngineCoreOutputs | None) -> dict[str, list[int]]:
    got: dict[str, list[int]] = {}
    for o in outs.outputs if outs is not None else []:
        got.setdefault(o.request_id, []).extend(o.new_token_ids)
    return got


def test_async_scheduling_keeps_exactly_two_batches_in_flight() -> None:
    # vLLM: max_concurrent_batches = 2 with async scheduling. The first call launches batch 1
    # and returns nothing; every later call launches batch N+1, then consumes batch N.
    core = make_core(async_scheduling=True)
    try:
        core.add_request(request("a", max_tokens=4))
        outs, executed = core.step_fn()
        assert (outs, executed, len(core.batch_queue)) == (None, True, 1)
        outs, executed = core.step_fn()
        assert executed and len(core.batch_queue) == 1
        assert [len(t) for t in tokens_of(outs).values()] == [1]  # batch 1: the prompt's token
        depth = [len(core.batch_queue)]
        while core.has_work():
            core.step_fn()
            depth.append(len(core.batch_queue))
        assert max(depth) <= 1  # between calls: the one batch launched and not yet consumed
    finally:
        core.shutdown()


def test_synchronous_scheduling_returns_each_steps_outputs_at_once() -> None:
    core = make_core(async_scheduling=False)
    try:
        core.add_request(request("a", max_tokens=3))
        outs, executed = core.step_fn()
        assert executed and tokens_of(outs) and len(tokens_of(outs)["a"]) == 1
        assert not core.batch_queue
    finally:
        core.shutdown()


@pytest.mark.parametrize("ended_by", ["length", "abort"])
def test_an_idle_async_core_has_no_batch_in_flight(ended_by: str) -> None:
    # The engine loop blocks on its inputs once has_work() is False: every batch launched by
    # then must have been consumed (its outputs applied, its async output slot returned).
    core = make_core(async_scheduling=True)
    try:
        core.add_request(request("a", max_tokens=3 if ended_by == "length" else 50))
        core.step_fn()
        if ended_by == "abort":
            core.step_fn()
            core.abort_requests(["a"])
        calls = 0
        while core.has_work():
            core.step_fn()
            calls += 1
            assert calls < 100, "the core never went idle"
        assert len(core.batch_queue) == 0
        assert core.num_free_kv_blocks == NUM_BLOCKS - 1  # block 0 is the null block
        stats = core.make_stats()
        assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
    finally:
        core.shutdown()


def test_the_core_refuses_requests_its_configuration_cannot_serve() -> None:
    # The front ends check too, but a client that skips them (another front end, a bad
    # caller) must not get a request scheduled that cannot be served.
    core = make_core()
    try:
        # (NUM_BLOCKS - 1) usable blocks of 16 tokens: 1008 tokens of KV cache in all, for the
        # prompt and every completion token but the last (never fed back).
        with pytest.raises(ValueError, match="max_tokens"):
            core.add_request(request("big", max_tokens=1008 - len(PROMPT) + 2))
        assert not core.has_work()
        core.add_request(request("fits", max_tokens=1008 - len(PROMPT) + 1))
        assert core.has_work()
    finally:
        core.shutdown()


def test_an_empty_prompt_is_refused_and_the_engine_serves_on() -> None:
    core = make_core()
    try:
        core.add_request(request("good"))
        with pytest.raises(ValueError, match="prompt"):
            core.add_request(EngineCoreRequest("empty", [], SamplingParams(max_tokens=2)))
        got: dict[str, list[int]] = {}
        for _ in range(20):
            for rid, ids in tokens_of(core.step_fn()[0]).items():
                got.setdefault(rid, []).extend(ids)
            if not core.has_work():
                break
        assert list(got) == ["good"] and len(got["good"]) == 4
    finally:
        core.shutdown()


def test_an_unset_max_tokens_runs_to_what_the_cache_holds() -> None:
    """max_tokens None from a client that skips the input processor: as many tokens as the
    context and the KV cache allow (here the cache: 1008 slots, the last token needs none),
    then finish reason length, as LLM.generate resolves it."""
    core = EngineCore(tiny_args(max_model_len=2048, num_gpu_blocks_override=NUM_BLOCKS))
    try:
        params = SamplingParams(max_tokens=None, ignore_eos=True, temperature=0.0)
        core.add_request(EngineCoreRequest("r", list(PROMPT), params, eos_token_id=None))
        count, reason = 0, None
        while core.has_work():
            outs = core.step_fn()[0]
            for o in outs.outputs if outs is not None else []:
                count += len(o.new_token_ids)
                reason = o.finish_reason or reason
        assert count == 1008 - len(PROMPT) + 1 and str(reason) == "length"
    finally:
        core.shutdown()


def test_equal_priorities_run_in_the_arrival_order_the_requests_carry() -> None:
    # Priority policy: (priority, arrival_time) orders waiting requests. The arrival time is
    # the request's own (stamped by the front end), not when the core happened to receive it.
    core = make_core(scheduling_policy="priority", max_num_seqs=1)
    try:
        core.add_request(request("late", max_tokens=2, arrival_time=2000.0, priority=3))
        core.add_request(request("early", max_tokens=2, arrival_time=1000.0, priority=3))
        order: list[str] = []
        while core.has_work():
            outs, _ = core.step_fn()
            order += [rid for rid in tokens_of(outs) if rid not in order]
        assert order == ["early", "late"]
    finally:
        core.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_an_abort_that_arrives_during_a_step_takes_none_of_its_tokens(
        async_scheduling: bool) -> None:
    """vLLM applies the aborts that came in while a step ran before that step's update: the
    aborted request gets no token from it, its neighbour does, and its blocks are freed."""
    core = make_core(async_scheduling=async_scheduling)
    try:
        core.add_request(request("a", max_tokens=8))
        core.add_request(request("b", max_tokens=8))
        execute = core.runner.execute_model

        def execute_and_abort(so):
            pending = execute(so)
            get_output = pending.get_output

            def abort_then_output():
                core.early_aborts.add(["a"])  # as EngineCoreProc.send hands it over
                return get_output()

            pending.get_output = abort_then_output
            core.runner.execute_model = execute  # only the first step
            return pending

        core.runner.execute_model = execute_and_abort
        got: dict[str, list[int]] = {}
        finished: list[str] = []
        while core.has_work():
            outs, _ = core.step_fn()
            for rid, ids in tokens_of(outs).items():
                got.setdefault(rid, []).extend(ids)
            finished += [o.request_id for o in (outs.outputs if outs else [])
                         if o.finish_reason is not None]
        assert "a" not in got and len(got["b"]) == 8
        assert core.scheduler.kv_cache_manager.usage == 0.0
        assert core.early_aborts.take() == []
    finally:
        core.shutdown()


def test_an_abort_handled_from_the_queue_is_not_applied_again() -> None:
    """The loop's copy of an abort takes the early one back: an id reused after it (the abort
    of a request that had finished, as a closed stream sends) is not aborted by a later step."""
    import asyncio

    from cadence.engine.async_llm import AsyncLLM

    async def body() -> list[int]:
        engine = AsyncLLM(tiny_args(max_model_len=128, num_gpu_blocks_override=NUM_BLOCKS))
        try:
            params = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)
            lengths = []
            for _ in range(2):
                outs = [o async for o in engine.generate({"prompt_token_ids": PROMPT}, params,
                                                         "x")]
                lengths.append(len(outs[-1].outputs[0].token_ids))
                await engine.abort("x")  # finished already: nothing to abort
            return lengths
        finally:
            engine.shutdown()

    assert asyncio.run(asyncio.wait_for(body(), 120)) == [3, 3]


def test_kv_cache_memory_bytes_sizes_the_cache() -> None:
    """vLLM's kv_cache_memory_bytes: the cache holds that many bytes' whole blocks (block 0
    reserved); too few bytes for two blocks is a one-line error naming the setting."""
    probe = EngineCore(tiny_args(max_model_len=128, num_gpu_blocks_override=4))
    block_bytes = probe.runner.kv_block_bytes()
    probe.shutdown()
    sized = dict(max_model_len=128, num_gpu_blocks_override=None)  # the tests' default off
    core = EngineCore(tiny_args(**sized, kv_cache_memory_bytes=block_bytes * 12 + 5))
    try:
        assert core.num_free_kv_blocks == 12 - 1
    finally:
        core.shutdown()
    with pytest.raises(ValueError, match="kv_cache_memory_bytes=.* holds 1 KV cache block"):
        EngineCore(tiny_args(**sized, kv_cache_memory_bytes=block_bytes + 1))
    # The override wins (vLLM's num_gpu_blocks_override over the memory sizes).
    core = EngineCore(tiny_args(max_model_len=128, kv_cache_memory_bytes=block_bytes * 12,
                                num_gpu_blocks_override=7))
    try:
        assert core.num_free_kv_blocks == 7 - 1
    finally:
        core.shutdown()
