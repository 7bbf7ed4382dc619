"""A stalled engine fails loudly: a planted KV block leak (freed blocks never returned) makes
``LLM.generate`` raise the cause, fails an AsyncLLM's requests through the engine-fault path,
and an ordinary workload under memory pressure (preemption) never trips the check."""

from __future__ import annotations

import asyncio

import pytest

from cadence.engine import AsyncLLM, EngineDeadError
from cadence.engine.llm import LLM
from cadence.sampling_params import SamplingParams
from cadence.scheduler.block_pool import BlockPool
from cadence.scheduler.stall import SchedulerStalledError
from tests.tiny import tiny_args

# 16 usable blocks of 16 tokens; each request needs 2 (20-token prompt + 8 tokens).
ARGS = dict(max_model_len=64, num_gpu_blocks_override=17, max_num_seqs=4,
            enable_prefix_caching=False)
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [40 + i] * 20} for i in range(12)]


def _leak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BlockPool, "free_blocks", lambda self, blocks: None)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_kv_block_leak_raises_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch, async_scheduling: bool
) -> None:
    _leak(monkeypatch)
    llm = LLM(**{**vars(tiny_args(**ARGS)), "async_scheduling": async_scheduling})
    try:
        # 12 requests x 2 blocks > 16 blocks: once the first 8 finish, nothing is ever freed.
        with pytest.raises(SchedulerStalledError, match=r"KV block leak") as info:
            llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        assert "16 blocks are held by no running request" in str(info.value)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_memory_pressure_and_preemption_are_not_a_stall(async_scheduling: bool) -> None:
    # Long generations in a cache that holds fewer than all of them: requests are preempted
    # and resumed, and every one finishes.
    llm = LLM(**{**vars(tiny_args(**{**ARGS, "num_gpu_blocks_override": 9})),
                 "async_scheduling": async_scheduling})
    try:
        params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
        outs = llm.generate(PROMPTS[:6], params, use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outs] == [40] * 6
        assert llm.engine_core.scheduler.num_preemptions > 0
    finally:
        llm.shutdown()


def test_a_stalled_core_fails_async_requests_with_the_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _leak(monkeypatch)

    async def main() -> None:
        engine = AsyncLLM(tiny_args(**ARGS))
        try:
            async def one(i: int) -> None:
                async for _ in engine.generate(PROMPTS[i], PARAMS, f"r{i}"):
                    pass

            results = await asyncio.gather(*(one(i) for i in range(12)),
                                           return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            assert errors and all(isinstance(e, EngineDeadError) for e in errors)
            assert engine.errored
            assert isinstance(engine.engine_core.proc.error, SchedulerStalledError)
            assert "KV block leak" in str(engine.engine_core.proc.error)
        finally:
            engine.shutdown()

    asyncio.run(main())
