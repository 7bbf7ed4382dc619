"""n > 1 (vLLM v1's parallel sampling): n children per request, seeds seed + index, the prompt
prefilled once and its blocks shared through the prefix cache."""

from __future__ import annotations

import asyncio

import pytest

from cadence import LLM, SamplingParams
from cadence.engine.async_llm import AsyncLLM
from cadence.sampling_params import RequestOutputKind
from tests.tiny import tiny_args

PROMPT = "Once upon a time, in a garden by the river, there lived a small"


def _llm(**kw) -> LLM:
    return LLM(**vars(tiny_args(**kw)))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_children_are_the_seeded_single_requests(async_scheduling):
    llm = _llm(async_scheduling=async_scheduling)
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)
    out = llm.generate([PROMPT], params, use_tqdm=False)
    assert len(out) == 1 and out[0].finished
    comps = out[0].outputs
    assert [c.index for c in comps] == [0, 1, 2]
    singles = [llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=5 + i, max_tokens=12,
                                                     ignore_eos=True), use_tqdm=False)
               [0].outputs[0].token_ids for i in range(3)]
    assert [c.token_ids for c in comps] == singles
    assert len({tuple(s) for s in singles}) == 3  # the seeds differ, and so do the choices
    again = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs
    assert [c.token_ids for c in again] == singles  # reproducible
    assert all(c.finish_reason == "length" for c in comps)


def test_the_prompt_is_prefilled_once_and_its_blocks_are_shared():
    llm = _llm()
    core = llm.engine_core
    n_prompt = len(llm.get_tokenizer().encode(PROMPT))
    block = core.block_size
    before = core.make_stats()
    out = llm.generate([PROMPT], SamplingParams(n=4, temperature=1.0, seed=4, max_tokens=5,
                                                ignore_eos=True), use_tqdm=False)
    after = core.make_stats()
    # Each of the three later children found the first child's full prompt blocks cached.
    full = (n_prompt - 1) // block * block
    assert full > 0
    assert after.prefix_cache_hits - before.prefix_cache_hits == 3 * full
    # Every child ran to its length; every block is free again.
    assert [len(c.token_ids) for c in out[0].outputs] == [5] * 4
    assert core.num_free_kv_blocks == core.num_kv_blocks - 1


def test_several_prompts_each_with_n_choices_and_mixed_requests():
    llm = _llm()
    params = [SamplingParams(n=2, temperature=0.8, seed=2, max_tokens=6, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
              SamplingParams(n=3, temperature=0.9, seed=1, max_tokens=3, ignore_eos=True)]
    outs = llm.generate(["Hello there", "The cat", "A bridge"], params, use_tqdm=False)
    assert [len(o.outputs) for o in outs] == [2, 1, 3]
    assert [len(c.token_ids) for o in outs for c in o.outputs] == [6, 6, 4, 3, 3, 3]


def _run(coro):
    return asyncio.run(coro)


def test_async_streams_every_choice_and_finishes_with_the_last():
    async def main():
        engine = AsyncLLM(tiny_args())
        try:
            params = SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=8, ignore_eos=True,
                                    output_kind=RequestOutputKind.DELTA)
            tokens: dict[int, list[int]] = {0: [], 1: [], 2: []}
            outs = []
            async for out in engine.generate(PROMPT, params, request_id="p"):
                outs.append(out)
                for c in out.outputs:
                    tokens[c.index].extend(c.token_ids)
            final = SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=8, ignore_eos=True,
                                   output_kind=RequestOutputKind.FINAL_ONLY)
            whole = [o async for o in engine.generate(PROMPT, final, request_id="q")]
            return outs, tokens, whole
        finally:
            engine.shutdown()

    outs, tokens, whole = _run(main())
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    assert all(o.request_id == "p" for o in outs)
    assert len(whole) == 1 and [c.index for c in whole[0].outputs] == [0, 1, 2]
    assert {i: c.token_ids for i, c in enumerate(whole[0].outputs)} == tokens


def test_aborting_the_parent_aborts_every_child():
    async def main():
        engine = AsyncLLM(tiny_args())
        try:
            params = SamplingParams(n=3, temperature=1.0, max_tokens=400, ignore_eos=True,
                                    output_kind=RequestOutputKind.DELTA)
            gen = engine.generate(PROMPT, params, request_id="p")
            seen = set()
            async for out in gen:  # until every child has produced a token
                seen |= {c.index for c in out.outputs if c.token_ids}
                if seen == {0, 1, 2}:
                    break
            await gen.aclose()  # the consumer leaves: the request is aborted
            stats = await engine.get_scheduler_stats()  # the aborts were queued before this call
            return stats, await engine.get_num_free_kv_blocks(), engine.num_kv_blocks
        finally:
            engine.shutdown()

    stats, free, total = _run(main())
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
    assert free == total - 1


def _gated_engine():
    """An AsyncLLM whose core steps only when opened (``gated[0].open()``)."""
    from tests.gated_core import GatedCore

    args = tiny_args()
    gated: list[GatedCore] = []

    def factory() -> GatedCore:
        gated.append(GatedCore(args))
        return gated[0]

    return AsyncLLM(args, core_factory=factory), gated


def test_abort_before_the_first_token_frees_the_id() -> None:
    """Children never sent to the core are not waited for: the id can be used again at once."""
    async def main():
        engine, gated = _gated_engine()
        try:
            params = SamplingParams(n=3, temperature=1.0, max_tokens=4, ignore_eos=True)
            collector = await engine.add_request("p", PROMPT, params)
            await engine.abort("p")  # no step ran: children 1 and 2 were never sent
            assert set(engine._ledger.draining) <= {"0_p"}  # only a sent child is waited for
            final = await collector.get()
            assert final.finished and {c.finish_reason for c in final.outputs} == {"abort"}
            assert engine.output_processor.parents == {}
            gated[0].open()
            final_only = SamplingParams(n=3, temperature=1.0, max_tokens=4, ignore_eos=True,
                                        output_kind=RequestOutputKind.FINAL_ONLY)
            again = [o async for o in engine.generate(PROMPT, final_only, request_id="p")]
            return again, set(engine._ledger.draining)
        finally:
            gated[0].open()
            engine.shutdown()

    again, draining = _run(main())
    assert [len(c.token_ids) for c in again[-1].outputs] == [4, 4, 4] and not draining


def test_aborting_one_child_id_aborts_its_whole_request() -> None:
    """A child's id (internal, but abort takes any id) aborts every choice of its request: its
    siblings, held until its prefill, would otherwise never be sent and the request never end."""
    async def main():
        engine, gated = _gated_engine()
        try:
            params = SamplingParams(n=3, temperature=1.0, max_tokens=4, ignore_eos=True)
            collector = await engine.add_request("p", PROMPT, params)
            await engine.abort("0_p")  # the first child, before any step ran
            final = await collector.get()
            assert final.finished and [c.finish_reason for c in final.outputs] == ["abort"] * 3
            assert engine.output_processor.parents == {}
            assert not engine.output_processor.request_states
            gated[0].open()
            stats = await engine.get_scheduler_stats()
            return stats, await engine.get_num_free_kv_blocks(), engine.num_kv_blocks
        finally:
            gated[0].open()
            engine.shutdown()

    stats, free, total = _run(main())
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0) and free == total - 1


def test_a_failing_first_child_offline_leaves_the_other_choices(monkeypatch) -> None:
    from cadence.worker import input_batch

    real_add = input_batch.InputBatch.add

    def add(self, req_id, *args, **kwargs):
        if req_id.startswith("0_"):
            raise ValueError("refused for the test")
        return real_add(self, req_id, *args, **kwargs)

    monkeypatch.setattr(input_batch.InputBatch, "add", add)
    llm = _llm()
    (out,) = llm.generate(["Hello"], SamplingParams(n=3, temperature=1.0, max_tokens=4,
                                                    ignore_eos=True), use_tqdm=False)
    assert [c.finish_reason for c in out.outputs] == ["error", "length", "length"]
    assert not llm.output_processor.request_states and not llm.output_processor.parents


def test_an_id_already_running_is_refused_naming_request_id() -> None:
    """A second request under an id that is still running (or one of an n > 1 request's child
    ids) is an InputValidationError naming request_id; the first runs on."""
    from cadence.engine.input_processor import InputValidationError

    async def main():
        engine, gated = _gated_engine()
        try:
            params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
            first = await engine.add_request("p", PROMPT, params)
            errors = []
            for rid, p in (("p", params), ("0_q", params)):
                if rid == "0_q":
                    await engine.add_request("q", PROMPT, SamplingParams(
                        n=2, temperature=1.0, max_tokens=3, ignore_eos=True))
                with pytest.raises(InputValidationError) as info:
                    await engine.add_request(rid, PROMPT, p)
                errors.append(info.value.parameter)
            gated[0].open()
            final = None
            while final is None or not final.finished:
                final = await first.get()
            return errors, final
        finally:
            gated[0].open()
            engine.shutdown()

    errors, final = _run(main())
    assert errors == ["request_id", "request_id"] and len(final.outputs[0].token_ids) == 3


@pytest.mark.parametrize("fail_at", [1, 6], ids=["children-unsent", "children-running"])
def test_an_engine_failure_ends_every_child_with_the_error(fail_at: int) -> None:
    """The engine dies under an n > 1 request (before its first child's prefill released the
    others, or with all three running): the parent's stream ends with EngineDeadError and no
    child, sent or not, stays pending."""
    from cadence.engine.async_llm import EngineDeadError
    from tests.engine.test_async_llm import FailingCore

    async def main():
        args = tiny_args()
        engine = AsyncLLM(args, core_factory=lambda: FailingCore(args, fail_at=fail_at))
        try:
            params = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=400,
                                    ignore_eos=True, output_kind=RequestOutputKind.DELTA)
            indices: set[int] = set()
            with pytest.raises(EngineDeadError):
                async for out in engine.generate(PROMPT, params, request_id="p"):
                    indices |= {c.index for c in out.outputs if c.token_ids}
            proc = engine.output_processor
            return (indices, engine.errored, dict(proc.request_states), dict(proc.parents),
                    engine.has_unfinished_requests())
        finally:
            engine.shutdown()

    indices, errored, states, parents, unfinished = _run(main())
    assert indices == (set() if fail_at == 1 else {0, 1, 2})
    assert errored and not states and not parents and not unfinished


def test_a_child_failing_alone_ends_its_request_and_aborts_its_siblings(monkeypatch) -> None:
    """One child of an n > 1 request is refused by the core while its siblings run: the
    consumer gets RequestFailedError once, the siblings are aborted in the core (no KV block
    held) and the engine serves on."""
    from cadence.engine.output_collector import RequestFailedError
    from cadence.worker import input_batch

    real_add = input_batch.InputBatch.add

    def add(self, req_id, *args, **kwargs):
        if req_id == "2_p":
            raise ValueError("refused for the test")
        return real_add(self, req_id, *args, **kwargs)

    monkeypatch.setattr(input_batch.InputBatch, "add", add)

    async def main():
        engine = AsyncLLM(tiny_args())
        try:
            params = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=400,
                                    ignore_eos=True, output_kind=RequestOutputKind.DELTA)
            with pytest.raises(RequestFailedError) as info:
                async for _ in engine.generate(PROMPT, params, request_id="p"):
                    pass
            # The siblings' aborts went to the core before the error reached the consumer.
            stats = await engine.get_scheduler_stats()
            free = await engine.get_num_free_kv_blocks()
            proc = engine.output_processor
            left = (dict(proc.request_states), dict(proc.parents))
            again = [o async for o in engine.generate(
                PROMPT, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), "q")]
            return info.value, stats, free, engine.num_kv_blocks, left, again, engine.errored
        finally:
            engine.shutdown()

    error, stats, free, total, left, again, errored = _run(main())
    assert error.request_id == "p"
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0) and free == total - 1
    assert left == ({}, {})
    assert len(again[-1].outputs[0].token_ids) == 3 and not errored
