"""AsyncLLM on the tiny model; the first six tests are vLLM's ``tests/v1/engine/test_async_llm.py``
cases with the same structure and expectations, scaled to the tiny model (n=1 only: parallel
sampling is not supported, so vLLM's n=3 rows run with n=1)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from cadence.engine import AsyncLLM, EngineDeadError  # the public import path
from cadence.engine.core import EngineCore
from cadence.engine.engine_args import EngineArgs
from cadence.outputs import RequestOutput
from cadence.sampling_params import RequestOutputKind, SamplingParams
from tests.child_env import child_env
from tests.gated_core import GatedCore
from tests.tiny import tiny_args as shared_tiny_args

TEXT_PROMPT = "Hello my name is Robert and"


def tiny_args(**kw: Any) -> EngineArgs:
    return shared_tiny_args(**{**dict(max_model_len=512, num_gpu_blocks_override=1024), **kw})




@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Iterator[AsyncLLM]:
    kw = getattr(request, "param", {})
    llm = AsyncLLM.from_engine_args(tiny_args(**kw))
    yield llm
    llm.shutdown()


async def generate(
    engine: AsyncLLM,
    request_id: str,
    prompt: Any,
    output_kind: RequestOutputKind,
    max_tokens: int,
    cancel_after: int | None = None,
    progress: dict[str, int] | None = None,
) -> tuple[int, str]:
    count = 0
    params = SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, output_kind=output_kind, temperature=0.5, seed=33
    )
    async for out in engine.generate(request_id=request_id, prompt=prompt, sampling_params=params):
        num_tokens = sum(len(o.token_ids) for o in out.outputs)
        if output_kind == RequestOutputKind.DELTA:
            count += num_tokens
        else:
            count = num_tokens
        if progress is not None:
            progress[request_id] = count
        if cancel_after is not None and count >= cancel_after:
            return count, request_id
        await asyncio.sleep(0.0)
    return count, request_id


KINDS = [RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY]


async def wait_for_tokens(engine: AsyncLLM, request_ids: list[str], at_least: int = 1) -> None:
    """Wait until each request is in the engine and has ``at_least`` tokens (the deadline only
    turns a hang into a failure)."""
    states = engine.output_processor.request_states

    def ready(rid: str) -> bool:
        return rid in states and states[rid].metrics.num_generation_tokens >= at_least

    async def poll() -> None:
        while not all(ready(rid) for rid in request_ids):
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), 60)


@pytest.mark.parametrize(
    "output_kind,num_requests,engine",
    [
        (RequestOutputKind.DELTA, 100, {}),
        (RequestOutputKind.FINAL_ONLY, 100, {}),
        (RequestOutputKind.DELTA, 32, {"async_scheduling": True}),
    ],
    indirect=["engine"],
)
async def test_load(output_kind: RequestOutputKind, num_requests: int, engine: AsyncLLM) -> None:
    num_expected_tokens = 10
    tasks = [
        asyncio.create_task(
            generate(engine, f"request-{i}", TEXT_PROMPT, output_kind, num_expected_tokens)
        )
        for i in range(num_requests)
    ]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for task in pending:
        task.cancel()
    assert not pending
    for task in done:
        num_generated_tokens, request_id = await task
        assert num_generated_tokens == num_expected_tokens, request_id
    assert not engine.output_processor.has_unfinished_requests()


@pytest.mark.parametrize("output_kind", KINDS)
async def test_abort(output_kind: RequestOutputKind, engine: AsyncLLM) -> None:
    num_requests, num_expected_tokens, num_expected_tokens_long = 32, 16, 300
    ids_to_abort = range(1, 32, 8)
    tasks: list[asyncio.Task[tuple[int, str]]] = []
    for idx in range(num_requests):
        max_tokens = num_expected_tokens_long if idx in ids_to_abort else num_expected_tokens
        tasks.append(
            asyncio.create_task(
                generate(engine, f"request-{idx}", TEXT_PROMPT, output_kind, max_tokens)
            )
        )
    # The API server cancels requests when their clients disconnect: here, once each one to
    # cancel runs in the engine (cancelling before it was submitted would test nothing).
    to_abort = [f"request-{idx}" for idx in ids_to_abort]
    await wait_for_tokens(engine, to_abort)
    states = engine.output_processor.request_states
    assert all(states[rid].metrics.num_generation_tokens < num_expected_tokens_long
               for rid in to_abort)
    for idx in ids_to_abort:
        tasks[idx].cancel()
    for idx, task in enumerate(tasks):
        if idx in ids_to_abort:
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            num_generated_tokens, request_id = await task
            assert num_generated_tokens == num_expected_tokens, request_id
    assert not engine.output_processor.has_unfinished_requests()
    # Another generation with a reused request id works.
    count, _ = await generate(
        engine, f"request-{ids_to_abort[0]}", TEXT_PROMPT, output_kind, num_expected_tokens
    )
    assert count == num_expected_tokens
    assert not engine.output_processor.has_unfinished_requests()
    stats = await engine.get_scheduler_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)


@pytest.mark.parametrize("output_kind", KINDS)
async def test_multi_abort(output_kind: RequestOutputKind, engine: AsyncLLM) -> None:
    num_requests, num_expected_tokens, num_expected_tokens_long = 24, 16, 300
    ids_to_abort = [5, 10, 15, 20]
    request_ids = [f"request-{i}" for i in range(num_requests)]
    tasks = [
        asyncio.create_task(
            generate(
                engine,
                rid,
                TEXT_PROMPT,
                output_kind,
                num_expected_tokens_long if idx in ids_to_abort else num_expected_tokens,
            )
        )
        for idx, rid in enumerate(request_ids)
    ]
    # Let the requests start (vLLM sleeps 0.5 s; here: until each one to abort has tokens).
    to_abort = [request_ids[i] for i in ids_to_abort]
    await wait_for_tokens(engine, to_abort)
    await engine.abort(to_abort)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for idx, result in enumerate(results):
        assert isinstance(result, tuple), f"request {idx} failed: {result!r}"
        num_generated_tokens, request_id = result
        if idx in ids_to_abort:
            # Aborted requests end with partial results.
            assert 0 < num_generated_tokens < num_expected_tokens_long, request_id
        else:
            assert num_generated_tokens == num_expected_tokens, request_id
    assert not engine.output_processor.has_unfinished_requests()


async def test_finished_flag(engine: AsyncLLM) -> None:
    params = SamplingParams(
        max_tokens=40, output_kind=RequestOutputKind.DELTA, temperature=1.0, seed=33
    )
    outputs = [
        out
        async for out in engine.generate(
            request_id="request-33", prompt=TEXT_PROMPT, sampling_params=params
        )
    ]
    assert len(outputs) > 1
    assert all(not out.finished for out in outputs[:-1])
    assert outputs[-1].finished


async def test_mid_stream_cancellation(engine: AsyncLLM) -> None:
    num_requests, num_tokens, num_expected_tokens = 32, 300, 8
    request_ids = [f"request-{i}" for i in range(num_requests)]
    tasks = [
        asyncio.create_task(
            generate(
                engine,
                rid,
                TEXT_PROMPT,
                RequestOutputKind.DELTA,
                num_tokens,
                cancel_after=num_expected_tokens,
            )
        )
        for rid in request_ids
    ]
    results = await asyncio.gather(*tasks)
    for num_generated_tokens, request_id in results:
        # DELTA outputs merged while the consumer lagged may overshoot by a few tokens.
        assert num_expected_tokens <= num_generated_tokens < num_tokens, request_id
    assert not engine.output_processor.has_unfinished_requests()
    count, _ = await generate(
        engine, request_ids[0], TEXT_PROMPT, RequestOutputKind.DELTA, num_expected_tokens
    )
    assert count == num_expected_tokens
    assert not engine.output_processor.has_unfinished_requests()
    # The cancelled requests were aborted in the engine core too, and freed their blocks.
    stats = await engine.get_scheduler_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
    assert await engine.get_num_free_kv_blocks() == engine.num_kv_blocks - 1


@pytest.mark.parametrize("output_kind", KINDS)
async def test_abort_final_output(output_kind: RequestOutputKind, engine: AsyncLLM) -> None:
    request_id = "test-abort-final-output"
    params = SamplingParams(
        max_tokens=400, ignore_eos=True, output_kind=output_kind, temperature=0.5, seed=42
    )
    outputs: list[RequestOutput] = []

    async def collect() -> RequestOutput | None:
        final = None
        async for out in engine.generate(TEXT_PROMPT, params, request_id):
            if not out.finished:
                outputs.append(out)
            final = out
        return final

    generated = asyncio.create_task(collect())
    await wait_for_tokens(engine, [request_id], at_least=3)
    # No await between reading the count and aborting: the final output holds exactly these.
    produced = engine.output_processor.request_states[request_id].metrics.num_generation_tokens
    assert 3 <= produced < 400
    await engine.abort(request_id)
    final = await generated
    assert final is not None and final.finished
    assert len(final.outputs) == 1
    assert final.outputs[0].finish_reason == "abort"
    assert final.outputs[0].stop_reason is None
    assert final.num_cached_tokens is not None and final.num_cached_tokens >= 0
    if output_kind == RequestOutputKind.DELTA:
        delivered = outputs + [final]
        assert sum(len(o.outputs[0].token_ids) for o in delivered) == produced
    else:
        assert outputs == []
        assert len(final.outputs[0].token_ids) == produced
    assert not engine.output_processor.has_unfinished_requests()


# -- beyond vLLM's cases -----------------------------------------------------------------------
async def test_invalid_input_raises_before_scheduling(engine: AsyncLLM) -> None:
    bad: list[tuple[Any, SamplingParams, dict[str, Any], str]] = [
        ("x" * 600, SamplingParams(max_tokens=4), {}, "maximum context length"),
        (TEXT_PROMPT, SamplingParams(max_tokens=10_000), {"strict_max_tokens": True},
         "maximum context length"),
        ({"prompt_token_ids": [1, 10_000]}, SamplingParams(), {}, "out of vocabulary"),
        ("", SamplingParams(), {}, "empty"),
        (TEXT_PROMPT, SamplingParams(), {"priority": 1 << 63}, "priority"),  # past int64
    ]
    for i, (prompt, params, kw, match) in enumerate(bad):
        with pytest.raises(ValueError, match=match):
            collector = await engine.add_request(f"bad-{i}", prompt, params, **kw)
            async for _ in engine.outputs(f"bad-{i}", collector):
                pass
    assert not engine.output_processor.has_unfinished_requests()
    stats = await engine.get_scheduler_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
    # A duplicate id of a running request is refused too, without disturbing the first one.
    params = SamplingParams(max_tokens=30, ignore_eos=True, temperature=0.0)
    first = engine.generate(TEXT_PROMPT, params, "dup")
    out = await first.__anext__()
    with pytest.raises(ValueError, match="already running"):
        async for _ in engine.generate(TEXT_PROMPT, params, "dup"):
            pass
    async for later in first:
        out = later
    assert out.finished and out.outputs[0].finish_reason == "length"


async def test_stop_string_finishes_and_frees_the_request_in_the_core(engine: AsyncLLM) -> None:
    greedy = SamplingParams(
        max_tokens=40, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA
    )
    full = ""
    async for out in engine.generate(TEXT_PROMPT, greedy, "full"):
        full += out.outputs[0].text
    stop = full[10:14]
    cut = full.index(stop)  # the first occurrence ends the text
    params = SamplingParams(
        max_tokens=40,
        ignore_eos=True,
        temperature=0.0,
        stop=[stop],
        output_kind=RequestOutputKind.DELTA,
    )
    text, final = "", None
    async for final in engine.generate(TEXT_PROMPT, params, "stopped"):
        text += final.outputs[0].text
    assert final is not None and final.finished
    assert final.outputs[0].finish_reason == "stop"
    assert final.outputs[0].stop_reason == stop
    assert text == full[:cut]
    # The output handler aborted it in the core before handing out the final output, so this
    # utility call, queued after the abort, sees nothing running and every block free.
    stats = await engine.get_scheduler_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
    assert await engine.get_num_free_kv_blocks() == engine.num_kv_blocks - 1


async def test_greedy_tokens_match_the_offline_engine(engine: AsyncLLM) -> None:
    params = SamplingParams(
        max_tokens=16, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA
    )
    streamed: list[int] = []
    async for out in engine.generate(TEXT_PROMPT, params, "a"):
        streamed.extend(out.outputs[0].token_ids)
    from cadence.engine.llm import LLM

    offline = LLM(**{k: v for k, v in vars(tiny_args()).items() if k != "model"}, model="tiny")
    final_only = SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.0)
    ref = offline.generate([TEXT_PROMPT], final_only, use_tqdm=False)[0].outputs[0].token_ids
    assert streamed == list(ref)


class FailingCore(EngineCore):
    """The real core, failing once it has stepped ``fail_at`` times."""

    def __init__(self, args: EngineArgs, fail_at: int) -> None:
        super().__init__(args)
        self.fail_at = fail_at
        self.steps = 0

    @property
    def step_fn(self):
        inner = super().step_fn

        def step():
            self.steps += 1
            if self.steps >= self.fail_at:
                raise RuntimeError("injected engine failure")
            return inner()

        return step


async def test_engine_crash_fails_every_request_with_engine_dead() -> None:
    args = tiny_args()
    llm = AsyncLLM(args, core_factory=lambda: FailingCore(args, fail_at=6))
    try:
        params = SamplingParams(max_tokens=200, ignore_eos=True, temperature=0.0)

        async def run(i: int) -> int:
            n = 0
            async for out in llm.generate(TEXT_PROMPT, params, f"r{i}"):
                n += len(out.outputs[0].token_ids)
            return n

        results = await asyncio.wait_for(
            asyncio.gather(*(run(i) for i in range(8)), return_exceptions=True), timeout=30
        )
        assert all(isinstance(r, EngineDeadError) for r in results), results
        assert llm.errored and not llm.is_running
        with pytest.raises(EngineDeadError):
            await llm.check_health()
        with pytest.raises(EngineDeadError):
            async for _ in llm.generate(TEXT_PROMPT, params, "after"):
                pass
    finally:
        llm.shutdown()


async def test_shutdown_ends_waiting_requests(engine: AsyncLLM) -> None:
    params = SamplingParams(max_tokens=400, ignore_eos=True, temperature=0.0)
    got: list[int] = []

    async def run() -> None:
        async for out in engine.generate(TEXT_PROMPT, params, "long"):
            got.extend(out.outputs[0].token_ids)

    task = asyncio.create_task(run())
    await wait_for_tokens(engine, ["long"], at_least=3)
    engine.shutdown()
    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(task, timeout=10)
    assert not engine.engine_core.proc.thread.is_alive()
    assert engine.errored


async def test_closing_the_generator_aborts_the_request(engine: AsyncLLM) -> None:
    params = SamplingParams(
        max_tokens=400, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA
    )
    gen = engine.generate(TEXT_PROMPT, params, "closed")
    for _ in range(3):
        await gen.__anext__()
    await gen.aclose()
    assert not engine.output_processor.has_unfinished_requests()
    stats = await engine.get_scheduler_stats()  # the abort was queued before this call
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
    assert await engine.get_num_free_kv_blocks() == engine.num_kv_blocks - 1


async def test_closing_a_stale_generator_spares_a_newer_request_with_its_id(
        engine: AsyncLLM) -> None:
    """A generator left open after its request was aborted, closed only once a new request
    reuses the id (the consumer dropped it), must not abort the new one (vLLM's generators
    abort their own internal ids only)."""
    params = SamplingParams(max_tokens=400, ignore_eos=True, temperature=0.0,
                            output_kind=RequestOutputKind.DELTA)
    stale = engine.generate(TEXT_PROMPT, params, "job")
    await stale.__anext__()
    await engine.abort("job")
    # The id is free once the aborted request is gone from the output processor.
    while engine.output_processor.is_request_active("job"):
        await asyncio.sleep(0.005)
    retry = engine.generate(TEXT_PROMPT, SamplingParams(
        max_tokens=12, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA),
        "job")
    first = await retry.__anext__()
    await stale.aclose()  # while the retry streams
    outs = [first] + [o async for o in retry]
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "length"
    assert sum(len(o.outputs[0].token_ids) for o in outs) == 12
    # Closed while its own request runs, a generator still aborts it.
    own = engine.generate(TEXT_PROMPT, params, "job")
    await own.__anext__()
    await own.aclose()
    assert not engine.output_processor.is_request_active("job")


async def test_closing_a_generator_spares_a_request_with_its_id_still_being_prepared(
        engine: AsyncLLM) -> None:
    """Request A's consumer closes its generator while request B, reusing A's id, is still
    being prepared: only A is aborted. (The close once aborted by id, which also marks every
    request under the id being prepared: B ended at once with "abort" and no tokens.)"""
    params = SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.0)
    first = engine.generate(TEXT_PROMPT, params, "x")
    await first.__anext__()  # A runs

    async def second() -> list:
        return [o async for o in engine.generate(TEXT_PROMPT, params, "x")]

    b = asyncio.create_task(second())
    for _ in range(10_000):  # until B is being prepared (not a time bound: yields)
        if "x" in engine._ledger.preparing:
            break
        await asyncio.sleep(0)
    assert "x" in engine._ledger.preparing
    await first.aclose()  # A's consumer leaves: A is aborted
    outs = await b
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "length"
    assert len(outs[-1].outputs[0].token_ids) == 20


async def test_a_steps_statistics_are_recorded_once_however_many_slices_it_takes() -> None:
    """A step of more outputs than one slice (OUTPUT_CHUNK_SIZE) is one iteration for the stat
    loggers (vLLM's iteration_tokens_total observes each step once)."""
    from cadence.engine.output_pump import OUTPUT_CHUNK_SIZE

    rows = OUTPUT_CHUNK_SIZE + 72
    llm = AsyncLLM.from_engine_args(tiny_args(max_num_seqs=rows, max_num_batched_tokens=4096))
    recorded: list[int] = []

    class Tokens:
        def record(self, scheduler_stats, iteration_stats) -> None:
            if iteration_stats is not None:
                recorded.append(iteration_stats.num_generation_tokens)

    llm.add_stat_logger(Tokens())  # type: ignore[arg-type]
    try:
        params = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)
        collectors = [await llm.add_request(f"r{i}", {"prompt_token_ids": [7, 8 + i % 50]},
                                            params) for i in range(rows)]
        for i, collector in enumerate(collectors):
            async for _ in llm.outputs(f"r{i}", collector):
                pass
    finally:
        llm.shutdown()
    assert sum(recorded) == 3 * rows
    # Every row decodes in the same steps: some step carried all of them at once.
    assert max(recorded) == rows > OUTPUT_CHUNK_SIZE


async def test_vllms_api_names(engine: AsyncLLM) -> None:
    """vLLM's ``await get_tokenizer()``, ``abort(..., internal=)`` and ``lora_request=None``;
    the package exports the output and prompt types."""
    import cadence

    assert await engine.get_tokenizer() is engine.tokenizer
    params = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)
    prompt: cadence.TokensPrompt = {"prompt_token_ids": [7, 8, 9]}
    outs = [o async for o in engine.generate(prompt, params, "api", lora_request=None)]
    assert isinstance(outs[-1], cadence.RequestOutput)
    assert isinstance(outs[-1].outputs[0], cadence.CompletionOutput)
    with pytest.raises(ValueError, match="lora_request"):
        async for _ in engine.generate(prompt, params, "api2", lora_request="adapter"):
            pass
    await engine.abort("nothing-by-this-id", internal=True)
    assert cadence.AsyncLLM is AsyncLLM and cadence.TextPrompt is not None
    # add_request in vLLM's order (request_id, prompt, params, arrival_time, lora_request,
    # tokenization_kwargs, trace_headers, priority, data_parallel_rank) and by its names.
    collector = await engine.add_request("pos", prompt, params, None, None,
                                         {"truncate_prompt_tokens": 2}, None, 0, 0)
    outs = [o async for o in engine.outputs("pos", collector)]
    assert outs[-1].prompt_token_ids == [8, 9] and outs[-1].finished
    collector = await engine.add_request(request_id="kw", prompt=prompt, params=params)
    assert [o async for o in engine.outputs("kw", collector)][-1].finished
    for bad in ({"lora_request": "adapter"}, {"data_parallel_rank": 1}, {"prompt_text": 3}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            await engine.add_request("bad", prompt, params, **bad)
    # generate's keywords in vLLM's set: trace_headers taken (no tracing here), prompt_text the
    # text a token-id prompt's outputs report.
    outs = [o async for o in engine.generate(prompt, params, "named", prompt_text="seven",
                                             trace_headers={"traceparent": "00-x"})]
    assert outs[-1].prompt == "seven" and outs[-1].finished
    assert not engine.output_processor.has_unfinished_requests()


async def test_async_engine_args_turn_on_request_logging(caplog: pytest.LogCaptureFixture) -> None:
    """``AsyncEngineArgs(enable_log_requests=True)`` (vLLM's) logs each request added."""
    import cadence

    args = cadence.AsyncEngineArgs(**vars(tiny_args()), enable_log_requests=True)
    assert isinstance(args, EngineArgs)
    for llm in (AsyncLLM.from_engine_args(args),
                AsyncLLM.from_engine_args(tiny_args(), enable_log_requests=True)):
        try:
            assert llm.log_requests
            caplog.clear()
            with caplog.at_level("INFO", logger="cadence.engine.async_llm"):
                params = SamplingParams(max_tokens=2, ignore_eos=True, temperature=0.0)
                async for _ in llm.generate(TEXT_PROMPT, params, "logged"):
                    pass
            assert "Added request 'logged'" in caplog.text
            assert f"prompt: {TEXT_PROMPT!r}" in caplog.text
            assert "Finished request 'logged' (finish reason length)" in caplog.text
        finally:
            llm.shutdown()


async def test_request_logs_cut_the_prompt_to_max_log_len(
        caplog: pytest.LogCaptureFixture) -> None:
    """vLLM's --max-log-len: a request's log line shows at most that many prompt characters
    and prompt token ids."""
    llm = AsyncLLM(tiny_args(), log_requests=True, max_log_len=3)
    try:
        with caplog.at_level("INFO", logger="cadence.engine.async_llm"):
            params = SamplingParams(max_tokens=1, temperature=0.0)
            async for _ in llm.generate({"prompt_token_ids": [5, 6, 7, 8, 9]}, params, "cut"):
                pass
            async for _ in llm.generate("abcdefgh", params, "text"):
                pass
        assert "prompt_token_ids: [5, 6, 7]." in caplog.text
        assert "prompt: 'abc'," in caplog.text and "abcd" not in caplog.text
    finally:
        llm.shutdown()


async def test_a_refused_request_is_logged_with_its_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    """vLLM logs a request before the engine checks it: a request the checks refuse (here a
    token id past the vocabulary) still leaves its log line, with the reason; no "Added"."""
    llm = AsyncLLM(tiny_args(), log_requests=True)
    try:
        bad = 10_000_000  # past any vocabulary of the built-in model
        params = SamplingParams(max_tokens=1, temperature=0.0)
        with caplog.at_level("INFO", logger="cadence.engine.async_llm"):
            with pytest.raises(ValueError):
                async for _ in llm.generate({"prompt_token_ids": [5, bad]}, params, "bad"):
                    pass
        assert f"Received request 'bad': prompt: [5, {bad}]" in caplog.text
        assert "refused:" in caplog.text and "Added request 'bad'" not in caplog.text
    finally:
        llm.shutdown()


async def test_output_handler_failure_stops_the_core() -> None:
    llm = AsyncLLM(tiny_args())
    try:
        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("detokenizer exploded")

        llm.output_processor.process_outputs = broken  # type: ignore[method-assign]
        params = SamplingParams(max_tokens=50, ignore_eos=True, temperature=0.0)
        with pytest.raises(EngineDeadError):
            async for _ in llm.generate(TEXT_PROMPT, params, "x"):
                pass
        # The core thread is stopped, not left running for no one.
        await asyncio.to_thread(llm.engine_core.proc.thread.join, 30)
        assert not llm.engine_core.proc.is_alive
        assert llm.errored
    finally:
        llm.shutdown()


async def test_a_dead_output_handler_marks_the_engine_errored_while_the_core_lives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The output handler fails and stops the core; until the core has stopped it still runs,
    yet the engine is errored from the moment the handler failed: a request then is refused
    at once instead of being handed to a core whose outputs nobody collects (a hang)."""
    import threading

    llm = AsyncLLM(tiny_args())
    stopping, release = threading.Event(), threading.Event()
    real_shutdown = llm.engine_core.shutdown

    def held_shutdown(timeout: float | None = 10.0) -> None:
        stopping.set()
        release.wait(30)  # only a bound: the test releases it
        real_shutdown(timeout)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("detokenizer exploded")

    monkeypatch.setattr(llm.engine_core, "shutdown", held_shutdown)
    monkeypatch.setattr(llm.output_processor, "process_outputs", broken)
    try:
        params = SamplingParams(max_tokens=50, ignore_eos=True, temperature=0.0)
        with pytest.raises(EngineDeadError):
            async for _ in llm.generate(TEXT_PROMPT, params, "x"):
                pass
        await asyncio.to_thread(stopping.wait, 30)
        assert llm.engine_core.proc.is_alive and not llm.engine_core.errored  # the core lives
        assert llm.errored
        with pytest.raises(EngineDeadError):
            await llm.check_health()
        with pytest.raises(EngineDeadError):
            async for _ in llm.generate({"prompt_token_ids": [1, 2, 3]}, params, "late"):
                pass
        assert not llm.output_processor.has_unfinished_requests()
        release.set()
        await asyncio.wait_for(llm.output_handler, 30)
        assert not llm.engine_core.proc.is_alive
    finally:
        release.set()
        llm.shutdown()


async def test_a_cancelled_output_handler_fails_the_waiting_requests(engine: AsyncLLM) -> None:
    """The output handler ends (cancelled, as when its event loop closes): the engine is
    errored, every waiting request gets EngineDeadError instead of hanging, and the core
    stops (nothing collects its outputs any more)."""
    params = SamplingParams(max_tokens=400, ignore_eos=True, temperature=0.0)
    tasks = {rid: asyncio.ensure_future(generate(engine, rid, TEXT_PROMPT,
                                                 RequestOutputKind.DELTA, 400))
             for rid in ("a", "b")}
    await wait_for_tokens(engine, list(tasks))
    handler = engine.output_handler
    assert handler is not None
    handler.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handler
    assert not engine.engine_core.proc.is_alive
    assert engine.errored
    for task in tasks.values():
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(task, 30)
    with pytest.raises(EngineDeadError):
        async for _ in engine.generate(TEXT_PROMPT, params, "after"):
            pass


async def test_small_inputs_are_processed_inline_unless_the_input_thread_is_busy(
    engine: AsyncLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from cadence.engine.input_worker import INLINE_INPUT_LIMIT
    from cadence.engine.input_worker import input_size as _input_size

    here = threading.current_thread()
    assert await engine.run_cpu(INLINE_INPUT_LIMIT, threading.current_thread) is here
    assert await engine.run_cpu(INLINE_INPUT_LIMIT + 1, threading.current_thread) is not here
    # While the input thread works, small work queues behind it: the tokenizer and the
    # order of requests stay with one thread at a time.
    gate = threading.Event()
    busy = asyncio.ensure_future(engine.run_in_executor(gate.wait, 30))
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(engine.run_cpu(1, threading.current_thread))
    await asyncio.sleep(0)
    assert not queued.done()
    gate.set()
    assert await busy is True
    assert await queued is not here
    assert await engine.run_cpu(1, threading.current_thread) is here  # idle again
    # Token ids are sized by their count; text always goes to the input thread.
    assert _input_size([1, 2, 3]) == 3 and _input_size({"prompt_token_ids": [5] * 9}) == 9
    assert _input_size("hi") > INLINE_INPUT_LIMIT
    assert _input_size({"prompt": "hi", "prompt_token_ids": [1]}) > INLINE_INPUT_LIMIT
    # Both paths give the same request.
    params = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)
    small = [t async for t in engine.generate({"prompt_token_ids": [7] * 5}, params, "a")]
    monkeypatch.setattr("cadence.engine.input_worker.INLINE_INPUT_LIMIT", 0)
    big = [t async for t in engine.generate({"prompt_token_ids": [7] * 5}, params, "b")]
    assert small[-1].outputs[0].token_ids == big[-1].outputs[0].token_ids


async def _until(cond: Any, what: str) -> None:
    """Yield to the loop until ``cond()`` holds (bounded)."""
    for _ in range(10_000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never: {what}")


async def test_inline_work_waits_for_thread_work_whose_caller_was_cancelled(
    engine: AsyncLLM,
) -> None:
    """A caller that stops waiting (its task cancelled) does not stop its work in the input
    thread: small work after it must still queue behind that work, not run beside it."""
    import threading

    here = threading.current_thread()
    gate = threading.Event()
    running = threading.Event()

    def busy() -> bool:
        running.set()
        return gate.wait(30)

    waiting = asyncio.ensure_future(engine.run_in_executor(busy))
    await _until(running.is_set, "the thread runs the work")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    small = asyncio.ensure_future(engine.run_cpu(1, threading.current_thread))
    await asyncio.sleep(0)
    assert not small.done()  # behind the cancelled caller's work, in the thread
    gate.set()
    assert await small is not here
    assert await engine.run_cpu(1, threading.current_thread) is here  # idle again


async def test_requests_queued_for_the_input_thread_at_shutdown_get_engine_dead() -> None:
    """Requests whose input work still waits for the input thread when the engine shuts down
    fail with ``EngineDeadError`` like those already in the engine; nobody cancelled them."""
    import threading

    engine = AsyncLLM.from_engine_args(tiny_args())
    gate = threading.Event()
    try:
        busy = asyncio.ensure_future(engine.run_in_executor(gate.wait, 30))
        tasks = [asyncio.ensure_future(generate(engine, f"q{i}", f"{TEXT_PROMPT} {i}",
                                                RequestOutputKind.DELTA, 5)) for i in range(3)]
        worker = engine._input_worker
        await _until(lambda: worker._inflight == 4, "three requests queue behind the work")
        engine.shutdown()
        gate.set()
        assert await busy is True
        for task in tasks:
            with pytest.raises(EngineDeadError):
                await task
            assert not task.cancelled()
    finally:
        gate.set()
        engine.shutdown()


@pytest.mark.parametrize("ended_by", ["abort", "stop string"])
async def test_a_reused_id_never_receives_the_ended_requests_tokens(ended_by: str) -> None:
    """Ending a request here (abort, stop string) while the engine already runs a step for it:
    a new request with the same id must not receive that step's token. The abort reaches the
    step in progress (vLLM applies aborts before the step's update), so the token never comes;
    the reused id gets its own tokens only."""
    args = tiny_args()
    llm = AsyncLLM(args, core_factory=lambda: GatedCore(args))
    core: GatedCore = llm.engine_core.proc.engine_core  # type: ignore[assignment]
    prompt = {"prompt_token_ids": [72, 101, 278, 111, 295, 121, 290, 346]}

    def greedy(max_tokens: int, stop: list[str] | None = None) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, stop=stop,
                              output_kind=RequestOutputKind.DELTA)

    async def drain(rid: str, collector: Any) -> list[int]:
        return [t async for out in llm.outputs(rid, collector) for t in out.outputs[0].token_ids]

    try:
        core.open()
        ref = await drain("ref", await llm.add_request("ref", prompt, greedy(6)))
        core.wait_idle()
        core.close()  # from here the test hands out every step
        params = greedy(100)
        if ended_by == "stop string":
            # A stop string that first occurs as the text of the third token.
            two, three = llm.tokenizer.decode(ref[:2]), llm.tokenizer.decode(ref[:3])
            stop = three[len(two):]
            assert stop and three.index(stop) == len(two)
            params = greedy(100, stop=[stop])
        collector = await llm.add_request("x", prompt, params)
        seen: list[int] = []
        for _ in range(3):
            core.allow()
            # Blocking the loop on purpose: the engine ran the step and drained its inputs, so
            # its next step runs for this "x" whatever the front end does now.
            core.wait_at_gate()
            out = await collector.get()
            seen += out.outputs[0].token_ids
        assert seen == ref[:3]
        if ended_by == "abort":
            assert not out.finished
            llm.abort_nowait(["x"])
        else:
            assert out.finished and out.outputs[0].finish_reason == "stop"
        # Added while the engine still runs the first "x" (and holds its late tokens back).
        reused = asyncio.ensure_future(llm.add_request("x", prompt, greedy(6)))
        await asyncio.sleep(0)
        core.open()
        assert await drain("x", await reused) == ref
        assert core.tokens["x"] == 3 + 6  # the step running when the abort came gave none
        assert not llm.output_processor.has_unfinished_requests()
    finally:
        core.open()
        llm.shutdown()


async def test_engine_dying_while_a_prompt_is_processed() -> None:
    """The engine dies while a prompt waits in the input thread: the request is refused with
    EngineDeadError and nothing is left registered."""
    import threading

    from cadence.core_types import EngineCoreRequest

    args = tiny_args()
    llm = AsyncLLM(args, core_factory=lambda: FailingCore(args, fail_at=1))
    try:
        gate = threading.Event()
        busy = asyncio.ensure_future(llm.run_in_executor(gate.wait, 30))
        params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)

        async def late() -> None:
            async for _ in llm.generate(TEXT_PROMPT, params, "late"):
                pass

        task = asyncio.ensure_future(late())
        await asyncio.sleep(0)  # its text waits behind the busy input thread
        assert not task.done()
        # Any step now kills the engine; the front end learns it from the output queue.
        llm.engine_core.add_request(EngineCoreRequest("trigger", [1, 2, 3], params))
        await asyncio.wait_for(llm.output_handler, 30)
        assert llm.errored
        gate.set()
        assert await busy is True
        with pytest.raises(EngineDeadError):
            await task
        assert not llm.output_processor.has_unfinished_requests()
    finally:
        llm.shutdown()


async def test_engine_dying_as_the_request_is_handed_over(engine: AsyncLLM,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The core thread stops between the request's registration and its hand-over to the core:
    EngineDeadError, and the registration is undone at once."""
    register = engine.output_processor.add_request

    def register_then_die(*args: Any, **kwargs: Any) -> list:
        to_send = register(*args, **kwargs)
        engine.engine_core.proc.shutdown()  # the thread is gone when this returns
        return to_send

    monkeypatch.setattr(engine.output_processor, "add_request", register_then_die)
    params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
    with pytest.raises(EngineDeadError):
        async for _ in engine.generate({"prompt_token_ids": [1, 2, 3]}, params, "handed-over"):
            pass
    # Checked before the output handler ran: the refused request did not stay registered.
    assert not engine.output_processor.has_unfinished_requests()


class BrokenStatLogger:
    def __init__(self) -> None:
        self.calls = 0

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        self.calls += 1
        raise RuntimeError("metrics backend down")


class CountingStatLogger:
    def __init__(self) -> None:
        self.generation_tokens = 0
        self.scheduler_stats = 0

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        self.scheduler_stats += scheduler_stats is not None
        if iteration_stats is not None:
            self.generation_tokens += iteration_stats.num_generation_tokens


async def test_a_failing_stat_logger_never_takes_serving_down(engine: AsyncLLM) -> None:
    broken, counting = BrokenStatLogger(), CountingStatLogger()
    engine.add_stat_logger(broken)  # first: the loggers after it must still be called
    engine.add_stat_logger(counting)
    params = SamplingParams(max_tokens=7, ignore_eos=True, temperature=0.0,
                            output_kind=RequestOutputKind.DELTA)
    for rid in ("a", "b"):
        ids = [t async for out in engine.generate(TEXT_PROMPT, params, rid)
               for t in out.outputs[0].token_ids]
        assert len(ids) == 7
    assert broken.calls > 0 and counting.generation_tokens == 14
    assert not engine.errored
    # A refresh of the stats for a scrape goes on past the broken logger too.
    before = counting.scheduler_stats
    await engine.do_log_stats()
    assert counting.scheduler_stats == before + 1


async def test_after_shutdown_every_call_says_the_engine_was_shut_down() -> None:
    """Not "died": requests, health checks and utility calls after shutdown() name it."""
    llm = AsyncLLM(tiny_args())
    llm.shutdown()
    params = SamplingParams(max_tokens=2)
    with pytest.raises(EngineDeadError, match=r"shut down \(by shutdown\(\)\)"):
        async for _ in llm.generate(TEXT_PROMPT, params, "late"):
            pass
    with pytest.raises(EngineDeadError, match="shut down"):
        await llm.check_health()
    with pytest.raises(EngineDeadError, match="shut down"):
        await llm.get_num_free_kv_blocks()


def test_an_engine_whose_event_loop_closed_stops_its_core() -> None:
    """Built outside an event loop and used in one asyncio.run: when that loop closes, the
    core thread stops (it ran on for no one), and a second loop is told the engine was shut
    down."""
    llm = AsyncLLM(tiny_args())
    params = SamplingParams(max_tokens=400, ignore_eos=True, temperature=0.0)

    async def first() -> None:
        task = asyncio.ensure_future(generate(llm, "a", TEXT_PROMPT, RequestOutputKind.DELTA,
                                              400))
        await wait_for_tokens(llm, ["a"], at_least=2)
        task.cancel()  # the loop closes with the request still running

    try:
        asyncio.run(first())
        assert not llm.engine_core.proc.thread.is_alive()

        async def second() -> None:
            with pytest.raises(EngineDeadError, match="shut down .by its event loop closing"):
                async for _ in llm.generate(TEXT_PROMPT, params, "b"):
                    pass

        asyncio.run(second())
    finally:
        llm.shutdown()


def test_a_script_that_never_shuts_its_engine_down_exits_cleanly(tmp_path) -> None:
    """A script that leaves a request running and never calls shutdown() exits cleanly: its
    event loop closing stops the core thread (a core still running torch code during the
    interpreter's teardown could abort the process); the engine's finalizer would at exit."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "leave.py"
    script.write_text(
        "import asyncio, threading\n"
        "from cadence.engine import AsyncLLM\n"
        "from cadence.sampling_params import SamplingParams\n"
        "from tests.engine.test_async_llm import tiny_args, wait_for_tokens\n"
        "async def main():\n"
        "    llm = AsyncLLM(tiny_args())\n"
        "    async def run():\n"
        "        async for _ in llm.generate('x', SamplingParams(max_tokens=500, "
        "ignore_eos=True), 'L'):\n"
        "            pass\n"
        "    asyncio.ensure_future(run())\n"
        "    await wait_for_tokens(llm, ['L'], at_least=2)\n"
        "    return llm\n"
        "llm = asyncio.run(main())\n"
        "print('core stopped before exit:', not llm.engine_core.proc.thread.is_alive())\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True,
                          text=True, timeout=300, env=child_env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert "core stopped before exit: True" in done.stdout


def test_the_finalizer_stops_an_engine_that_was_never_shut_down() -> None:
    """At interpreter exit (or when collected) an engine never shut down has its core stopped;
    shutdown() detaches that finalizer."""
    llm = AsyncLLM(tiny_args())
    assert llm._finalizer.alive and llm._finalizer.atexit
    llm._finalizer()  # what interpreter exit runs
    assert not llm.engine_core.proc.thread.is_alive()
    llm.shutdown()
    assert not llm._finalizer.alive


async def test_an_abort_while_the_request_is_prepared_is_not_lost(
        engine: AsyncLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """abort() between generate() and the request reaching the engine (its prompt still being
    tokenized): the request ends with finish_reason "abort" as soon as it is added, instead of
    running to its end."""
    gate = asyncio.Event()
    real_run_cpu = engine.run_cpu

    async def gated(*args: Any, **kwargs: Any) -> Any:
        await gate.wait()
        return await real_run_cpu(*args, **kwargs)

    monkeypatch.setattr(engine, "run_cpu", gated)
    params = SamplingParams(max_tokens=300, ignore_eos=True, temperature=0.0)
    outs: list[RequestOutput] = []

    async def consume() -> None:
        async for out in engine.generate(TEXT_PROMPT, params, "r"):
            outs.append(out)

    task = asyncio.ensure_future(consume())
    while "r" not in engine._ledger.preparing:
        await asyncio.sleep(0)
    await engine.abort("r")
    gate.set()
    await asyncio.wait_for(task, 60)
    assert outs and outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    assert len(outs[-1].outputs[0].token_ids) < 300
    assert not engine._ledger.preparing and not engine._ledger.aborted_early
    assert not engine.output_processor.has_unfinished_requests()
