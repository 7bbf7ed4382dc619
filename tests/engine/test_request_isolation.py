"""A request that fails inside the engine fails alone: its consumer gets an error, its KV blocks
are freed, and every other request completes with the tokens it would have had anyway."""

from __future__ import annotations

import asyncio

import pytest

from cadence.core_types import EngineCoreOutput, EngineCoreRequest, FinishReason
from cadence.engine.async_llm import AsyncLLM
from cadence.engine.core import EngineCore
from cadence.engine.output_processor import OutputProcessor, RequestFailedError
from cadence.sampling_params import RequestOutputKind, SamplingParams
from tests.tiny import tiny_args

PROMPTS = [[72, 101, 278, 111, 295], [84, 104, 101, 32, 113, 117], [65, 32, 115, 109, 97]]


def _greedy(max_tokens: int = 6) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _poisoned() -> SamplingParams:
    # Bypasses the input processor (which would normalise it): no int64 holds this top_k.
    p = SamplingParams(temperature=0.8, top_k=5, max_tokens=6, ignore_eos=True)
    p.top_k = 1 << 70
    return p


def _run_core(core: EngineCore, requests: list[EngineCoreRequest]) -> dict[str, EngineCoreOutput]:
    for req in requests:
        core.add_request(req)
    final: dict[str, EngineCoreOutput] = {}
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    for _ in range(200):
        if not core.has_work():
            break
        outs, _ = core.step_fn()
        for o in outs.outputs if outs is not None else []:
            tokens[o.request_id].extend(o.new_token_ids)
            if o.finished:
                final[o.request_id] = EngineCoreOutput(
                    o.request_id, tokens[o.request_id], finish_reason=o.finish_reason,
                    error=o.error,
                )
    assert not core.has_work(), "the engine did not drain"
    return final


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_poisoned_request_fails_alone_in_the_core(async_scheduling: bool) -> None:
    core = EngineCore(tiny_args(async_scheduling=async_scheduling, max_model_len=128,
                                num_gpu_blocks_override=64))
    free = core.num_free_kv_blocks
    good = [EngineCoreRequest(f"g{i}", p, _greedy()) for i, p in enumerate(PROMPTS)]
    reference = _run_core(core, good)
    assert all(len(o.new_token_ids) == 6 for o in reference.values())

    again = [EngineCoreRequest(f"h{i}", p, _greedy()) for i, p in enumerate(PROMPTS)]
    bad = EngineCoreRequest("bad", PROMPTS[0], _poisoned())
    final = _run_core(core, [again[0], bad, again[1], again[2]])
    assert final["bad"].finish_reason == FinishReason.ERROR
    assert final["bad"].new_token_ids == []
    assert "top_k" in (final["bad"].error or "") or "int" in (final["bad"].error or "")
    for i in range(len(PROMPTS)):
        assert final[f"h{i}"].new_token_ids == reference[f"g{i}"].new_token_ids
        assert final[f"h{i}"].finish_reason == FinishReason.LENGTH
    assert core.num_free_kv_blocks == free
    assert core.scheduler.get_num_unfinished_requests() == 0
    core.shutdown()


def test_a_request_the_core_refuses_gets_an_error_not_a_dead_engine() -> None:
    async def main() -> None:
        engine = AsyncLLM(tiny_args(max_model_len=128, num_gpu_blocks_override=64))
        try:
            # A duplicate id is refused by the scheduler inside the engine thread.
            core = engine.engine_core.proc.engine_core
            req = EngineCoreRequest("dup", PROMPTS[0], _greedy(200))
            await engine.call_utility("add_request", req)
            params = _greedy(4)
            params.output_kind = RequestOutputKind.FINAL_ONLY
            with pytest.raises(RequestFailedError, match="already"):
                async for _ in engine.generate({"prompt_token_ids": PROMPTS[1]}, params, "dup"):
                    pass
            await engine.abort("dup")
            finals = [o async for o in engine.generate({"prompt_token_ids": PROMPTS[2]}, params,
                                                       "ok")]
            assert len(finals[-1].outputs[0].token_ids) == 4
            assert not engine.errored
            stats = await engine.get_scheduler_stats()
            assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
            assert core.num_free_kv_blocks == core.num_kv_blocks - 1
        finally:
            engine.shutdown()

    asyncio.run(main())


def test_async_llm_poisoned_request_raises_and_others_finish() -> None:
    async def main() -> None:
        engine = AsyncLLM(tiny_args(max_model_len=128, num_gpu_blocks_override=64,
                                    async_scheduling=True))
        try:
            core = engine.engine_core.proc.engine_core

            async def run(rid: str, prompt: list[int], params: SamplingParams) -> list[int]:
                ids: list[int] = []
                async for out in engine.generate({"prompt_token_ids": prompt}, params, rid):
                    ids.extend(out.outputs[0].token_ids)
                return ids

            delta = _greedy()
            delta.output_kind = RequestOutputKind.DELTA
            ref = await asyncio.gather(*(run(f"r{i}", p, delta) for i, p in enumerate(PROMPTS)))
            # The input processor would normalise the bad top_k, so enqueue it behind its back.
            bad_params = _poisoned()
            bad_params.output_kind = RequestOutputKind.DELTA
            request, _ = engine.input_processor.process(
                "bad", {"prompt_token_ids": PROMPTS[0]}, _greedy()
            )
            request.sampling_params = bad_params
            collector = await _add_raw(engine, request)
            results = await asyncio.gather(
                *(run(f"s{i}", p, delta) for i, p in enumerate(PROMPTS)),
                _drain(engine, "bad", collector),
                return_exceptions=True,
            )
            assert results[:3] == ref
            assert isinstance(results[3], RequestFailedError)
            assert not engine.errored
            assert core.num_free_kv_blocks == core.num_kv_blocks - 1
        finally:
            engine.shutdown()

    asyncio.run(main())


async def _add_raw(engine: AsyncLLM, request: EngineCoreRequest):
    from cadence.engine.output_processor import RequestOutputCollector

    engine._run_output_handler()
    collector = RequestOutputCollector(RequestOutputKind.DELTA, request.request_id)
    engine.output_processor.add_request(request, None, collector)
    engine.engine_core.add_request(request)
    return collector


async def _drain(engine: AsyncLLM, rid: str, collector) -> list[int]:
    ids: list[int] = []
    async for out in engine.outputs(rid, collector):
        ids.extend(out.outputs[0].token_ids)
    return ids


class _ExplodingDetokenizer:
    output_token_ids: list[int] = []
    output_text = ""

    def update(self, *args, **kwargs):
        raise UnicodeError("cannot decode")


def test_output_processor_isolates_a_failing_request() -> None:
    proc = OutputProcessor(None)
    for rid in ("a", "b"):
        proc.add_request(EngineCoreRequest(rid, [1, 2], _greedy()), None)
    proc.request_states["a"].detokenizer = _ExplodingDetokenizer()  # type: ignore[assignment]
    res = proc.process_outputs([EngineCoreOutput("a", [5]), EngineCoreOutput("b", [6])])
    assert res.reqs_to_abort == ["a"]
    by_id = {o.request_id: o for o in res.request_outputs}
    assert by_id["a"].finished and by_id["a"].outputs[0].finish_reason == "error"
    assert not proc.is_request_active("a") and proc.is_request_active("b")
    res = proc.process_outputs(
        [EngineCoreOutput("b", [7], finish_reason=FinishReason.LENGTH)]
    )
    assert res.request_outputs[0].outputs[0].token_ids == [6, 7]
    assert [f.finish_reason for f in res.iteration_stats.finished_requests] == ["length"]


def _reused_id_params() -> list[tuple[str, SamplingParams]]:
    from cadence.structured_outputs_params import StructuredOutputsParams

    # Each constrains the first request to a token the plain request's greedy answer avoids.
    return [
        ("grammar", SamplingParams(temperature=0.0, max_tokens=2, structured_outputs=
                                   StructuredOutputsParams(choice=["yes", "no"]))),
        ("allowed_token_ids", SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True,
                                             allowed_token_ids=[33])),
        ("logit_bias", SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True,
                                      logit_bias={33: 100.0})),
        ("prompt_logprobs", SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True,
                                           prompt_logprobs=2)),
    ]


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize(("kind", "first"), _reused_id_params(), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_an_id_reused_the_step_after_its_request_ended_starts_clean(
        async_scheduling: bool, kind: str, first: SamplingParams) -> None:
    """A request id may be reused once its request has finished; the new request's step is the
    one that tells the worker the old one ended. Nothing of the old request's sampling state
    (a grammar, allowed ids, biases, prompt logprobs) may constrain the new one: a plain greedy
    request under the reused id answers as it does under a fresh id."""
    from cadence.engine.llm_engine import LLMEngine

    engine = LLMEngine(tiny_args(device="cpu", async_scheduling=async_scheduling))
    try:
        plain = _greedy(8)
        prompt = {"prompt_token_ids": PROMPTS[0]}

        def run(rid: str, params: SamplingParams) -> list:
            engine.add_request(rid, prompt, params)
            outs = []
            for _ in range(100):
                if not engine.has_unfinished_requests():
                    break
                outs += [o for o in engine.step() if o.finished]
            assert [o.request_id for o in outs] == [rid]
            return outs

        reference = run("fresh", plain)[0]
        run("x", first)  # ends: the worker hears of it with the next step's output
        again = run("x", plain)[0]
        assert list(again.outputs[0].token_ids) == list(reference.outputs[0].token_ids), kind
        assert again.prompt_logprobs is None
    finally:
        engine.shutdown()
