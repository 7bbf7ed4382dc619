from __future__ import annotations

import asyncio
import math
import threading

import pytest
from transformers import PreTrainedTokenizerFast

from cadence.core_types import EngineCoreOutput, EngineCoreRequest, FinishReason
from cadence.engine.output_processor import OutputProcessor, RequestOutputCollector
from cadence.outputs import CompletionOutput, RequestOutput
from cadence.sampling_params import RequestOutputKind, SamplingParams
from tests.tokenizers_helper import byte_level_tokenizer

CORPUS = [
    "hello world, the quick brown fox jumps over the lazy dog.",
    "the world is wide and the stop sign is red. stop here, or stop there.",
]
DELTA, CUMULATIVE, FINAL_ONLY = (
    RequestOutputKind.DELTA,
    RequestOutputKind.CUMULATIVE,
    RequestOutputKind.FINAL_ONLY,
)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return byte_level_tokenizer(CORPUS, vocab_size=300, special_tokens=["<|eos|>"])


# Collector (ported from vLLM's tests/v1/engine/test_output_processor.py) ------------------------


def _ro(idx: int, n: int, text: str = "a") -> RequestOutput:
    last = idx == n - 1
    return RequestOutput(
        request_id="my-request-id",
        prompt=None,
        prompt_token_ids=[1, 2, 3],
        prompt_logprobs=None,
        outputs=[
            CompletionOutput(
                index=0,
                text=text,
                token_ids=[idx],
                cumulative_logprob=idx + 1.0,
                logprobs=[{idx: None}],  # type: ignore[dict-item]
                finish_reason="length" if last else None,
            )
        ],
        finished=last,
    )


async def test_request_output_collector() -> None:
    n = 3
    collector = RequestOutputCollector(DELTA, request_id="my-request-id-int")

    # Put then get.
    collector.put(_ro(0, n))
    output = await collector.get()
    assert not collector.ready.is_set()
    assert collector.output is None
    assert output.outputs[0].text == "a"
    assert output.outputs[0].token_ids == [0]

    # Two puts then get: merged.
    for i in range(2):
        collector.put(_ro(i, n))
    output = await collector.get()
    assert not collector.ready.is_set() and collector.output is None
    assert not output.finished
    assert output.outputs[0].text == "aa"
    assert output.outputs[0].token_ids == [0, 1]
    assert output.outputs[0].logprobs is not None and len(output.outputs[0].logprobs) == 2
    assert output.outputs[0].cumulative_logprob == 2.0  # the latest one

    # All three, including the finished one.
    for i in range(3):
        collector.put(_ro(i, n))
    output = await collector.get()
    assert output.finished
    assert output.outputs[0].finish_reason == "length"
    assert output.outputs[0].text == "aaa"
    assert output.outputs[0].token_ids == [0, 1, 2]
    assert output.outputs[0].cumulative_logprob == 3.0


async def test_cumulative_output_collector_replaces_by_index() -> None:
    collector = RequestOutputCollector(CUMULATIVE, request_id="r")
    first = RequestOutput(
        "r", None, [1], None, [CompletionOutput(0, "a", [0]), CompletionOutput(1, "b", [1])],
        False,
    )
    second = RequestOutput(
        "r", None, [1], None,
        [CompletionOutput(0, "ab", [0, 1]), CompletionOutput(2, "c", [2])], False,
    )
    collector.put(first)
    collector.put(second)
    result = await collector.get()
    by_index = {c.index: c for c in result.outputs}
    assert sorted(by_index) == [0, 1, 2]
    assert by_index[0].text == "ab" and by_index[0].token_ids == [0, 1]
    assert by_index[1].text == "b" and by_index[1].token_ids == [1]
    assert by_index[2].text == "c"


async def test_get_nowait_and_final_only() -> None:
    collector = RequestOutputCollector(FINAL_ONLY)
    assert collector.get_nowait() is None
    collector.put(_ro(0, 3, text="x"))
    collector.put(_ro(2, 3, text="xyz"))  # not merged: replaced
    out = collector.get_nowait()
    assert out is not None and out.outputs[0].text == "xyz" and out.finished
    assert collector.get_nowait() is None


async def test_get_waits_for_put() -> None:
    collector = RequestOutputCollector(DELTA)
    task = asyncio.create_task(collector.get())
    await asyncio.sleep(0)  # the task runs up to its wait
    await asyncio.sleep(0)
    assert not task.done()
    collector.put(_ro(0, 2))
    out = await asyncio.wait_for(task, 30)
    assert out.outputs[0].token_ids == [0]


async def test_exception_is_raised_and_never_replaced() -> None:
    collector = RequestOutputCollector(DELTA)
    collector.put(_ro(0, 2))
    collector.put(RuntimeError("engine dead"))
    collector.put(_ro(1, 2))  # an output never hides the error
    with pytest.raises(RuntimeError, match="engine dead"):
        await collector.get()
    collector.put(ValueError("again"))
    with pytest.raises(ValueError):
        collector.get_nowait()


async def test_put_from_another_thread_wakes_the_consumer() -> None:
    collector = RequestOutputCollector(DELTA)
    task = asyncio.create_task(collector.get())
    await asyncio.sleep(0)  # the task runs up to its wait: the put must wake it
    assert not task.done()
    thread = threading.Thread(target=collector.put, args=(_ro(0, 2),))
    thread.start()
    out = await asyncio.wait_for(task, 30)
    thread.join()
    assert out.outputs[0].token_ids == [0]



def test_a_put_after_the_consumers_loop_closed_is_kept_not_raised() -> None:
    """A request's consumer may be gone with its loop (``asyncio.run`` returned) while the
    engine still produces: the output processor's put must not fail on the closed loop."""

    async def made_in_a_loop() -> RequestOutputCollector:
        return RequestOutputCollector(DELTA, "r")

    collector = asyncio.run(made_in_a_loop())  # bound to that loop, now closed
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            collector.put(_ro(0, 2))
        except BaseException as exc:  # noqa: BLE001 - the test reports whatever it raised
            errors.append(exc)

    thread = threading.Thread(target=produce)
    thread.start()
    thread.join()
    assert errors == []
    out = collector.get_nowait()
    assert out is not None and out.outputs[0].token_ids == [0]


# OutputProcessor ---------------------------------------------------------------------------------


def _req(rid: str, prompt: list[int], **kw: object) -> EngineCoreRequest:
    return EngineCoreRequest(rid, prompt, SamplingParams(**kw))  # type: ignore[arg-type]


def _run(
    proc: OutputProcessor,
    tokens: dict[str, list[int]],
    finish: dict[str, FinishReason] | None = None,
) -> tuple[list[RequestOutput], list[str]]:
    """Feed one token per step per request (mock engine core); the last one finishes."""
    finish = finish or {}
    outs: list[RequestOutput] = []
    aborts: list[str] = []
    step = 0
    while any(step < len(t) for t in tokens.values()):
        batch = []
        for rid, toks in tokens.items():
            if step < len(toks):
                last = step == len(toks) - 1
                reason = finish.get(rid, FinishReason.LENGTH) if last else None
                batch.append(EngineCoreOutput(rid, [toks[step]], finish_reason=reason))
        res = proc.process_outputs(batch)
        outs.extend(res.request_outputs)
        aborts.extend(res.reqs_to_abort)
        step += 1
    return outs, aborts


@pytest.mark.parametrize("kind", [DELTA, CUMULATIVE, FINAL_ONLY])
def test_output_kinds(tokenizer: PreTrainedTokenizerFast, kind: RequestOutputKind) -> None:
    proc = OutputProcessor(tokenizer)
    texts = {"a": " the quick brown fox", "b": " hello world, the lazy dog."}
    tokens = {rid: tokenizer.encode(t) for rid, t in texts.items()}
    for rid in tokens:
        proc.add_request(_req(rid, [5, 6], output_kind=kind), prompt="xy")
    outs, aborts = _run(proc, tokens)
    assert not aborts and not proc.has_unfinished_requests()
    for rid, text in texts.items():
        mine = [o for o in outs if o.request_id == rid]
        assert mine[-1].finished and all(not o.finished for o in mine[:-1])
        assert mine[-1].outputs[0].finish_reason == "length"
        assert mine[-1].prompt == "xy" and mine[-1].prompt_token_ids == [5, 6]
        if kind == DELTA:
            assert len(mine) == len(tokens[rid])
            assert "".join(o.outputs[0].text for o in mine) == text
            assert [t for o in mine for t in o.outputs[0].token_ids] == tokens[rid]
        elif kind == CUMULATIVE:
            assert len(mine) == len(tokens[rid])
            assert mine[-1].outputs[0].text == text
            assert mine[0].outputs[0].token_ids == tokens[rid][:1]  # not mutated later
            assert all(
                mine[i + 1].outputs[0].text.startswith(mine[i].outputs[0].text)
                for i in range(len(mine) - 1)
            )
        else:
            assert len(mine) == 1
            assert mine[0].outputs[0].text == text
            assert mine[0].outputs[0].token_ids == tokens[rid]


def test_stop_string_finishes_and_aborts_in_engine(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = OutputProcessor(tokenizer)
    tokens = tokenizer.encode(" the stop sign is red")
    proc.add_request(_req("s", [5], stop=["sign", "red"], output_kind=DELTA), None)
    proc.add_request(_req("o", [5], output_kind=DELTA), None)
    outs, aborts = _run(proc, {"s": tokens, "o": tokens})
    mine = [o for o in outs if o.request_id == "s"]
    assert aborts == ["s"]
    final = mine[-1]
    assert final.finished and final.outputs[0].finish_reason == "stop"
    assert final.outputs[0].stop_reason == "sign"
    assert "".join(o.outputs[0].text for o in mine) == " the stop "
    other = "".join(o.outputs[0].text for o in outs if o.request_id == "o")
    assert other == " the stop sign is red"  # the other request is unaffected
    assert not proc.has_unfinished_requests()


def test_stop_string_included_and_cumulative(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = OutputProcessor(tokenizer)
    tokens = tokenizer.encode(" hello world, the quick")
    proc.add_request(_req("s", [5], stop=["world"], include_stop_str_in_output=True), None)
    outs, aborts = _run(proc, {"s": tokens})
    assert aborts == ["s"]
    assert outs[-1].outputs[0].text == " hello world"
    assert outs[-1].outputs[0].stop_reason == "world"


def test_stop_token_from_engine(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = OutputProcessor(tokenizer)
    tokens = tokenizer.encode(" hello world")
    proc.add_request(_req("t", [5], stop_token_ids=[tokens[-1]]), None)
    eco = [EngineCoreOutput("t", tokens, finish_reason=FinishReason.STOP, stop_reason=tokens[-1])]
    res = proc.process_outputs(eco)
    assert res.reqs_to_abort == []  # the engine core already finished it
    out = res.request_outputs[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == tokens[-1]
    assert out.text == tokenizer.decode(tokens[:-1]) and out.token_ids == tokens


def test_outputs_for_unknown_or_finished_requests_are_ignored(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    proc = OutputProcessor(tokenizer)
    proc.add_request(_req("x", [5]), None)
    proc.process_outputs([EngineCoreOutput("x", [72], finish_reason=FinishReason.LENGTH)])
    res = proc.process_outputs([EngineCoreOutput("x", [73]), EngineCoreOutput("nope", [1])])
    assert res.request_outputs == [] and res.reqs_to_abort == []
    proc.add_request(_req("y", [5]), None)
    with pytest.raises(ValueError, match="already running"):
        proc.add_request(_req("y", [5]), None)
    # An n > 1 request whose choice would take a running request's id ("1_z", vLLM's child
    # ids "{index}_{parent}") names that request, not its own id (which is not running).
    proc.add_request(_req("1_z", [5]), None)
    with pytest.raises(ValueError, match="z clashes with running request 1_z .the id of its "
                                         "choice 1"):
        proc.add_request(_req("z", [5], n=2, temperature=1.0), None)
    assert "z" not in proc.parents and "0_z" not in proc.request_states


@pytest.mark.parametrize("kind", [DELTA, CUMULATIVE])
@pytest.mark.parametrize("interval", [2, 3, 50])
def test_stream_interval_sends_every_k_tokens_and_the_first_and_last(
    tokenizer: PreTrainedTokenizerFast, kind: RequestOutputKind, interval: int
) -> None:
    """vLLM's stream_interval: outputs with the first token, then each time ``interval`` new
    tokens have come, and with the last; what they carry joins up as every step's would."""
    text = " the quick brown fox jumps over the lazy dog"
    tokens = tokenizer.encode(text)
    rows = [([t, t], [-0.5 - i, -0.5 - i], 1) for i, t in enumerate(tokens)]
    proc = OutputProcessor(tokenizer)
    proc.add_request(_req("s", [5], output_kind=kind, stream_interval=interval, logprobs=1),
                     None)
    outs = []
    for i, t in enumerate(tokens):
        reason = FinishReason.LENGTH if i == len(tokens) - 1 else None
        res = proc.process_outputs([EngineCoreOutput("s", [t], finish_reason=reason,
                                                     new_logprobs=[rows[i]])])
        outs.append(res.request_outputs[0] if res.request_outputs else None)
    n = len(tokens)
    # Steps with an output: the first, each interval-th token after it, and the last.
    want = {0, n - 1} | set(range(interval, n, interval))
    assert {i for i, o in enumerate(outs) if o is not None} == want
    sent = [o for o in outs if o is not None]
    assert sent[-1].finished and not any(o.finished for o in sent[:-1])
    if kind == DELTA:
        assert "".join(o.outputs[0].text for o in sent) == text
        assert [t for o in sent for t in o.outputs[0].token_ids] == tokens
        assert [next(iter(r)) for o in sent for r in o.outputs[0].logprobs] == tokens
    else:
        assert sent[-1].outputs[0].text == text and sent[-1].outputs[0].token_ids == tokens
        assert [len(o.outputs[0].token_ids) for o in sent] == [i + 1 for i in sorted(want)]
    assert math.isclose(sent[-1].outputs[0].cumulative_logprob or 0.0,
                        sum(r[1][0] for r in rows))


@pytest.mark.parametrize(("engine", "own", "want"), [(3, None, 3), (3, 1, 3), (3, 5, 5),
                                                    (1, 4, 4)])
def test_a_requests_stream_interval_raises_the_engines_never_lowers_it(
    tokenizer: PreTrainedTokenizerFast, engine: int, own: int | None, want: int
) -> None:
    """vLLM: the effective interval is the larger of the engine's and the request's."""
    tokens = tokenizer.encode(" the quick brown fox jumps over the lazy dog")
    proc = OutputProcessor(tokenizer, stream_interval=engine)
    proc.add_request(_req("i", [5], output_kind=DELTA, stream_interval=own), None)
    steps = []
    for i, t in enumerate(tokens):
        reason = FinishReason.LENGTH if i == len(tokens) - 1 else None
        if proc.process_outputs([EngineCoreOutput("i", [t], finish_reason=reason)]
                                ).request_outputs:
            steps.append(i)
    n = len(tokens)
    assert steps == sorted({0, n - 1} | set(range(want, n, want)))


@pytest.mark.parametrize(("fields", "sent"), [({}, 1), ({"prompt_logprobs": 1}, 3),
                                              ({"skip_reading_prefix_cache": True}, 3)])
def test_children_that_cannot_share_the_prompts_blocks_go_at_once(
    tokenizer: PreTrainedTokenizerFast, fields: dict, sent: int
) -> None:
    """n > 1: the first child goes to the core, the others once its prompt is cached; children
    that read no cached block (prompt logprobs, skip_reading_prefix_cache) all go at once."""
    proc = OutputProcessor(tokenizer)
    out = proc.add_request(_req("p", [5, 6], n=3, temperature=1.0, **fields), None)
    assert [r.request_id for r in out] == [f"{i}_p" for i in range(sent)]
    res = proc.process_outputs([EngineCoreOutput(r.request_id, [72]) for r in out])
    assert len(res.reqs_to_add) == 3 - sent  # the rest, once the first child's prompt is in


@pytest.mark.parametrize(("count", "rows"), [(7, [1, 4, 2]), (5, [1, 4, 0])])
def test_a_failed_delta_request_hands_over_what_was_held(
    tokenizer: PreTrainedTokenizerFast, count: int, rows: list[int]
) -> None:
    """Offline, a request that fails ends with an "error" output; in DELTA mode it carries
    what no output carried yet (the tokens, rows and text stream_interval held; none where
    nothing was held), so that the outputs still join up to everything generated."""
    tokens = tokenizer.encode(" one two three four five")[:count]  # outputs at the 1st, 5th
    proc = OutputProcessor(tokenizer)
    proc.add_request(_req("f", [5], output_kind=DELTA, stream_interval=4, logprobs=0), None)
    sent = []
    for t in tokens:
        res = proc.process_outputs([EngineCoreOutput("f", [t], new_logprobs=[([t], [-1.0], 1)])])
        sent += res.request_outputs
    res = proc.process_outputs([EngineCoreOutput("f", [], finish_reason=FinishReason.ERROR,
                                                 error="boom")])
    last = res.request_outputs[-1].outputs[0]
    assert last.finish_reason == "error" and res.request_outputs[-1].finished
    outs = [o.outputs[0] for o in sent] + [last]
    assert [t for o in outs for t in o.token_ids] == tokens
    assert "".join(o.text for o in outs) == tokenizer.decode(tokens)
    assert [len(o.logprobs) for o in outs] == rows
    assert last.token_ids == tokens[5:]  # the 6th and 7th were held, if there were such


def test_logprobs_rows(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = OutputProcessor(tokenizer)
    proc.add_request(_req("l", [5], logprobs=1, output_kind=DELTA), None)
    a, b, c = tokenizer.encode("hello")[0], tokenizer.encode(" world")[0], 72
    # Engine rows carry the batch's max (2) top logprobs; this request asked for 1.
    rows = [([a, c, a], [-0.5, -0.1, -0.5], 2), ([b, b, c], [-0.2, -0.2, -1.5], 1)]
    res = proc.process_outputs([EngineCoreOutput("l", [a, b], new_logprobs=rows)])
    out = res.request_outputs[0].outputs[0]
    assert out.logprobs is not None and len(out.logprobs) == 2
    first, second = out.logprobs
    assert list(first) == [a, c]
    assert first[a].logprob == -0.5 and first[a].rank == 2
    assert first[a].decoded_token == tokenizer.decode([a])
    assert first[c].rank == 1 and first[c].decoded_token == tokenizer.decode([c])
    assert list(second) == [b] and second[b].rank == 1
    assert math.isclose(out.cumulative_logprob or 0.0, -0.7)

    rows2 = [([c, a], [-3.0, -0.1], 5)]
    res = proc.process_outputs(
        [EngineCoreOutput("l", [c], finish_reason=FinishReason.LENGTH, new_logprobs=rows2)]
    )
    out = res.request_outputs[0].outputs[0]
    assert out.logprobs is not None and len(out.logprobs) == 1  # DELTA: only the new row
    assert out.logprobs[0][c].rank == 5
    assert math.isclose(out.cumulative_logprob or 0.0, -3.7)



def test_a_chosen_token_tied_inside_the_top_n_takes_its_place_rank(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """vLLM's row: the chosen token, then the top-N with ranks 1..N, a later entry replacing an
    earlier one of the same id. Chosen token 41 tied with 40 (both -1.0) comes second in the
    top-N: its count of tokens at least as likely is 3 (7, 40, 41), its place 2; the row's ranks
    are 1, 2, 3, none twice."""
    proc = OutputProcessor(tokenizer)
    proc.add_request(_req("t", [5], logprobs=3, output_kind=DELTA), None)
    rows = [([41, 7, 41, 40], [-1.0, -0.5, -1.0, -1.0], 3)]
    res = proc.process_outputs([EngineCoreOutput("t", [41], new_logprobs=rows)])
    (row,) = res.request_outputs[0].outputs[0].logprobs or []
    assert list(row) == [41, 7, 40]  # the chosen token stays first
    assert {t: lp.rank for t, lp in row.items()} == {41: 2, 7: 1, 40: 3}
    # Chosen outside the top-N: its own count stands.
    rows = [([9, 7, 41, 40], [-2.0, -0.5, -1.0, -1.0], 4)]
    res = proc.process_outputs([EngineCoreOutput("t", [9], new_logprobs=rows)])
    (row,) = res.request_outputs[0].outputs[0].logprobs or []
    assert {t: lp.rank for t, lp in row.items()} == {9: 4, 7: 1, 41: 2, 40: 3}

def test_no_logprobs_requested(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = OutputProcessor(tokenizer)
    proc.add_request(_req("n", [5]), None)
    out = proc.process_outputs([EngineCoreOutput("n", [72], finish_reason=FinishReason.LENGTH)])
    completion = out.request_outputs[0].outputs[0]
    assert completion.logprobs is None and completion.cumulative_logprob is None


async def test_collectors_abort_and_errors(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = OutputProcessor(tokenizer)
    queues = {rid: RequestOutputCollector(DELTA, rid) for rid in ("a", "b", "c")}
    for rid, q in queues.items():
        proc.add_request(_req(rid, [5], output_kind=DELTA, stop=["zzz"]), None, queue=q)
    tokens = tokenizer.encode(" hello world")
    res = proc.process_outputs([EngineCoreOutput(rid, tokens) for rid in queues])
    assert res.request_outputs == []  # they went to the collectors
    first = queues["a"].get_nowait()
    assert first is not None and first.outputs[0].text == " hello wor"  # 2 chars held back

    assert proc.abort_requests(["a", "missing"]) == ["a"]
    final = await queues["a"].get()
    assert final.finished and final.outputs[0].finish_reason == "abort"
    assert final.outputs[0].text == "ld"  # the held-back text is released at the end
    assert proc.get_num_unfinished_requests() == 2

    proc.propagate_error(RuntimeError("boom"))
    for rid in ("b", "c"):
        with pytest.raises(RuntimeError, match="boom"):
            await queues[rid].get()


async def test_abort_final_only_gets_everything(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = OutputProcessor(tokenizer)
    q = RequestOutputCollector(FINAL_ONLY, "f")
    proc.add_request(_req("f", [5], output_kind=FINAL_ONLY), None, queue=q)
    tokens = tokenizer.encode(" the lazy dog")
    proc.process_outputs([EngineCoreOutput("f", tokens)])
    assert q.get_nowait() is None
    proc.abort_requests(["f"])
    out = await q.get()
    assert out.finished and out.outputs[0].text == " the lazy dog"
    assert out.outputs[0].token_ids == tokens and out.outputs[0].finish_reason == "abort"


def test_without_tokenizer() -> None:
    proc = OutputProcessor(None)
    proc.add_request(_req("n", [1, 2], logprobs=0), None)
    rows = [([7], [-0.3], 1), ([8], [-0.4], 2)]
    res = proc.process_outputs(
        [EngineCoreOutput("n", [7, 8], finish_reason=FinishReason.LENGTH, new_logprobs=rows)]
    )
    out = res.request_outputs[0].outputs[0]
    assert out.text == "" and out.token_ids == [7, 8]
    assert out.logprobs is not None and out.logprobs[1][8].decoded_token is None


def test_metrics_and_iteration_stats(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = OutputProcessor(tokenizer)
    proc.add_request(_req("m", [5, 6, 7]), None)
    arrival = proc.request_states["m"].metrics.arrival_time
    s1 = proc.process_outputs([EngineCoreOutput("m", [72])], engine_core_timestamp=arrival + 1.0)
    assert s1.iteration_stats.time_to_first_tokens == [pytest.approx(1.0)]
    assert s1.iteration_stats.num_prompt_tokens == 3
    s2 = proc.process_outputs([EngineCoreOutput("m", [73])], engine_core_timestamp=arrival + 1.5)
    assert s2.iteration_stats.inter_token_latencies == [pytest.approx(0.5)]
    s3 = proc.process_outputs(
        [EngineCoreOutput("m", [74, 75], finish_reason=FinishReason.LENGTH)],
        engine_core_timestamp=arrival + 2.5,
    )
    # vLLM's inter-token latency: from the previous token's output, not from the first's.
    assert s3.iteration_stats.inter_token_latencies == [pytest.approx(1.0)]
    metrics = s3.request_outputs[0].metrics
    assert metrics is not None
    assert metrics.time_to_first_token == pytest.approx(1.0)
    assert metrics.e2e_latency == pytest.approx(2.5)
    assert metrics.num_generation_tokens == 4
    assert metrics.mean_time_per_output_token == pytest.approx(0.5)
    (fin,) = s3.iteration_stats.finished_requests
    assert fin.finish_reason == "length" and fin.num_generation_tokens == 4
    assert s3.iteration_stats.num_generation_tokens == 2


def test_multibyte_delta_streaming(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = OutputProcessor(tokenizer)
    text = " 你好 😀 world"
    tokens = tokenizer.encode(text)
    assert len(tokens) > 8
    proc.add_request(_req("u", [5], output_kind=DELTA), None)
    outs, _ = _run(proc, {"u": tokens})
    assert all("\ufffd" not in o.outputs[0].text for o in outs)
    assert "".join(o.outputs[0].text for o in outs) == text


@pytest.mark.parametrize("text", [" 你好 😀 world", "😀 world", "你好"])
def test_logprob_tokens_of_character_pieces_join_into_the_text(
    tokenizer: PreTrainedTokenizerFast, text: str
) -> None:
    """vLLM's logprobs processor: a token holding part of a UTF-8 character shows "" until the
    token that completes it, which shows the whole character, so that the chosen tokens'
    texts join into the answer; prompt logprobs read the prompt's tokens the same way. Also
    where a character starts the output (its pieces are the output's first tokens)."""
    from cadence.runner_output import LogprobsLists

    tokens = tokenizer.encode(text)
    assert sum(tokenizer.decode([t]).endswith("\ufffd") for t in tokens) >= 2  # split chars

    def whole(ids: list[int]) -> str:  # a prefix's text without its unfinished character
        return tokenizer.decode(ids).rstrip("\ufffd")

    expected = [whole(tokens[:i + 1])[len(whole(tokens[:i])):] for i in range(len(tokens))]
    assert "".join(expected) == text and "" in expected
    proc = OutputProcessor(tokenizer)
    prompt = [5, *tokens]
    proc.add_request(_req("u", prompt, logprobs=1, prompt_logprobs=0), None)
    scored = (1, LogprobsLists([[t] for t in tokens], [[-0.5]] * len(tokens),
                               [1] * len(tokens)))
    outs = []
    for i, t in enumerate(tokens):
        # The row's alternative is the chosen token itself: it reads the same in its place.
        outs += proc.process_outputs([EngineCoreOutput(
            "u", [t], finish_reason=FinishReason.LENGTH if i == len(tokens) - 1 else None,
            new_logprobs=[([t, t], [-0.1, -0.1], 1)],
            new_prompt_logprobs=scored if i == 0 else None)]).request_outputs
    out = outs[-1]
    assert [row[t].decoded_token for row, t in zip(out.outputs[0].logprobs, tokens)] == expected
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    assert [row[t].decoded_token for row, t in zip(out.prompt_logprobs[1:], tokens)] == expected


def test_abort_of_an_n_request_returns_only_the_children_the_core_has(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """Only sent children are aborted in the core (and waited for): the others never reach it."""
    proc = OutputProcessor(tokenizer)
    req = _req("p", [5, 6], n=3)
    sent = proc.add_request(req, prompt="xy")
    assert [r.request_id for r in sent] == ["0_p"]
    assert proc.abort_requests(["p"]) == ["0_p"]
    assert not proc.request_states and not proc.parents
    # Once the first child's prompt is prefilled, the others are sent: all three are aborted.
    req = _req("q", [5, 6], n=3)
    proc.add_request(req, prompt="xy")
    res = proc.process_outputs([EngineCoreOutput("0_q", [7])])
    assert sorted(r.request_id for r in res.reqs_to_add) == ["1_q", "2_q"]
    assert sorted(proc.abort_requests(["q"])) == ["0_q", "1_q", "2_q"]


@pytest.mark.parametrize("kind", [DELTA, CUMULATIVE])
def test_prompt_logprobs_in_delta_and_cumulative_outputs(
    tokenizer: PreTrainedTokenizerFast, kind: RequestOutputKind
) -> None:
    """The prompt's logprobs come with the first output of a delta stream and with every
    output of a cumulative one (each is whole)."""
    from cadence.runner_output import LogprobsLists

    proc = OutputProcessor(tokenizer)
    proc.add_request(_req("r", [5, 6, 7], prompt_logprobs=0, max_tokens=3, output_kind=kind),
                     prompt=None)
    scored = (1, LogprobsLists([[6], [7]], [[-1.5], [-0.25]], [2, 1]))
    steps = [EngineCoreOutput("r", [8], new_prompt_logprobs=scored), EngineCoreOutput("r", [9]),
             EngineCoreOutput("r", [10], finish_reason=FinishReason.LENGTH)]
    outs = [o for step in steps for o in proc.process_outputs([step]).request_outputs]
    assert len(outs) == 3
    for i, out in enumerate(outs):
        if kind == DELTA and i > 0:
            assert out.prompt_logprobs == []  # vLLM's pop leaves an empty list
            continue
        first, six, seven = out.prompt_logprobs
        assert first is None  # the first prompt token has no logprob
        assert (six[6].logprob, six[6].rank, seven[7].logprob, seven[7].rank) == (
            -1.5, 2, -0.25, 1)


def test_each_output_keeps_its_own_metrics_snapshot(tokenizer: PreTrainedTokenizerFast) -> None:
    """An output handed out earlier is not changed by later tokens: its metrics say how many
    tokens had come when it was made."""
    proc = OutputProcessor(tokenizer)
    proc.add_request(_req("r", [5, 6], max_tokens=3, output_kind=CUMULATIVE), prompt=None)
    steps = [EngineCoreOutput("r", [7]), EngineCoreOutput("r", [8]),
             EngineCoreOutput("r", [9], finish_reason=FinishReason.LENGTH)]
    outs = [o for step in steps for o in proc.process_outputs([step]).request_outputs]
    assert [o.metrics.num_generation_tokens for o in outs] == [1, 2, 3]
    assert outs[0].metrics.finished_time is None and outs[-1].metrics.finished_time is not None


def test_finished_stats_carry_n_and_the_phases_in_order(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """The request histograms' inputs: n of an n > 1 request and the most tokens one of its
    choices generated, once, with its last choice to finish (vLLM); the phases from the core's
    (queued, first scheduled) timing, never negative."""
    import time as _time

    proc = OutputProcessor(tokenizer)
    proc.add_request(_req("p", [5, 6], max_tokens=1, n=2), prompt=None)
    t0 = _time.monotonic()
    first = proc.process_outputs([EngineCoreOutput(
        "0_p", [7], finish_reason=FinishReason.LENGTH, timing=(t0 - 0.5, t0 - 0.2))])
    second = proc.process_outputs([EngineCoreOutput(
        "1_p", [8], finish_reason=FinishReason.LENGTH, timing=(t0 - 0.4, t0 - 0.1))])
    stats = first.iteration_stats.finished_requests + second.iteration_stats.finished_requests
    assert [s.n_param for s in stats] == [None, 2]
    assert [s.max_num_generation_tokens for s in stats] == [None, 1]
    # One token each: no decode gap, a time per output token of 0 (vLLM's rule).
    assert [s.mean_time_per_output_token for s in stats] == [0.0, 0.0]
    for s in stats:
        assert s.queued_time is not None and s.prefill_time is not None
        assert 0.29 <= s.queued_time <= 0.31 and s.prefill_time >= 0.1
