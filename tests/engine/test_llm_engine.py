"""vLLM's ``LLMEngine`` step loop (``add_request`` / ``step`` / ``abort_request``) on the tiny
model, sync and async scheduling: what each step hands out, aborts, parallel sampling, bad input."""

from __future__ import annotations

import pytest

from cadence import LLM, EngineArgs, LLMEngine
from cadence.engine.param_checks import InputValidationError
from cadence.sampling_params import RequestOutputKind, SamplingParams
from tests.tiny import tiny_args

PROMPTS = ["Hello my name is", "The capital of France is", "One two three"]


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def engine(request: pytest.FixtureRequest):
    eng = LLMEngine.from_engine_args(tiny_args(async_scheduling=request.param))
    yield eng
    eng.shutdown()


def _run(engine: LLMEngine, max_steps: int = 1000) -> list[list]:
    """Step until nothing is unfinished (within ``max_steps``: far more than these requests'
    tokens); the outputs of each step."""
    steps = []
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return steps
        steps.append(engine.step())
    raise AssertionError(f"requests still unfinished after {max_steps} steps")


def _greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def test_the_step_loop_streams_every_request_to_its_end(engine: LLMEngine) -> None:
    lengths = [3, 7, 5]
    for i, (prompt, n) in enumerate(zip(PROMPTS, lengths, strict=True)):
        assert engine.add_request(f"r{i}", prompt, _greedy(n)) == f"r{i}"
    assert engine.get_num_unfinished_requests() == 3
    seen: dict[str, list[list[int]]] = {f"r{i}": [] for i in range(3)}
    finished = {}
    for outs in _run(engine):
        for out in outs:
            assert out.request_id not in finished  # nothing after a request's last output
            seen[out.request_id].append(list(out.outputs[0].token_ids))
            if out.finished:
                finished[out.request_id] = out
    assert engine.get_num_unfinished_requests() == 0 and engine.step() == []
    for i, n in enumerate(lengths):
        history = seen[f"r{i}"]
        # Cumulative (the default): one output a token, each the one before plus one token.
        assert [len(h) for h in history] == list(range(1, n + 1))
        assert all(h[:-1] == prev for prev, h in zip(history, history[1:]))
        assert finished[f"r{i}"].outputs[0].finish_reason == "length"
    # The same tokens as LLM.generate, whose final-only outputs take another path.
    llm = LLM("tiny", async_scheduling=False)
    try:
        want = llm.generate(PROMPTS, [_greedy(n) for n in lengths], use_tqdm=False)
    finally:
        llm.shutdown()
    for i, w in enumerate(want):
        assert seen[f"r{i}"][-1] == list(w.outputs[0].token_ids)
        assert finished[f"r{i}"].outputs[0].text == w.outputs[0].text
    assert engine.engine_core.num_free_kv_blocks == engine.engine_core.num_kv_blocks - 1


def test_output_kinds(engine: LLMEngine) -> None:
    engine.add_request("delta", PROMPTS[0], _greedy(6, output_kind=RequestOutputKind.DELTA))
    engine.add_request("final", PROMPTS[0], _greedy(6, output_kind=RequestOutputKind.FINAL_ONLY))
    engine.add_request("whole", PROMPTS[0], _greedy(6))
    got: dict[str, list] = {"delta": [], "final": [], "whole": []}
    for outs in _run(engine):
        for out in outs:
            got[out.request_id].append(out)
    whole = list(got["whole"][-1].outputs[0].token_ids)
    assert len(whole) == 6
    assert [t for o in got["delta"] for t in o.outputs[0].token_ids] == whole
    assert "".join(o.outputs[0].text for o in got["delta"]) == got["whole"][-1].outputs[0].text
    assert len(got["final"]) == 1 and list(got["final"][0].outputs[0].token_ids) == whole


def test_abort_request_stops_it_and_frees_its_blocks(engine: LLMEngine) -> None:
    engine.add_request("long", PROMPTS[0], _greedy(200))
    engine.add_request("short", PROMPTS[1], _greedy(4))
    after_abort: list[str] = []
    aborted = False
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if aborted:
                after_abort.append(out.request_id)
            if out.request_id == "long" and len(out.outputs[0].token_ids) >= 3 and not aborted:
                engine.abort_request(["long"])
                engine.abort_request("never-added")  # unknown ids are ignored
                aborted = True
    assert aborted and "long" not in after_abort
    assert engine.engine_core.num_free_kv_blocks == engine.engine_core.num_kv_blocks - 1


def test_parallel_sampling_and_stop_strings(engine: LLMEngine) -> None:
    # Final-only: one output holding both choices. Streamed (vLLM's n > 1 streaming): each
    # output holds one choice as it grows, and only the last one says finished.
    final_only = SamplingParams(n=2, max_tokens=5, seed=7, ignore_eos=True,
                                output_kind=RequestOutputKind.FINAL_ONLY)
    engine.add_request("n2", PROMPTS[2], final_only)
    (final,) = [o for outs in _run(engine) for o in outs]
    assert final.finished and sorted(c.index for c in final.outputs) == [0, 1]
    assert all(len(c.token_ids) == 5 for c in final.outputs)
    engine.add_request("n2s", PROMPTS[2], SamplingParams(n=2, max_tokens=5, seed=7,
                                                         ignore_eos=True))
    streamed = [o for outs in _run(engine) for o in outs]
    assert [o.finished for o in streamed] == [False] * (len(streamed) - 1) + [True]
    last = {}
    for o in streamed:
        (choice,) = o.outputs
        last[choice.index] = list(choice.token_ids)
    # Seeded: the same choices as the final-only request's.
    assert last == {c.index: list(c.token_ids) for c in final.outputs}
    # A stop string ends the request in the core too (its blocks come back).
    engine.add_request("full", PROMPTS[0], _greedy(30))
    text = [o for outs in _run(engine) for o in outs][-1].outputs[0].text
    stop = text[8:11]
    engine.add_request("stopped", PROMPTS[0], _greedy(30, stop=[stop]))
    final = [o for outs in _run(engine) for o in outs][-1]
    assert final.outputs[0].finish_reason == "stop"
    assert final.outputs[0].text == text[: text.index(stop)]
    assert engine.engine_core.num_free_kv_blocks == engine.engine_core.num_kv_blocks - 1


def test_bad_input_is_refused_before_anything_is_queued(engine: LLMEngine) -> None:
    engine.add_request("dup", PROMPTS[0], _greedy(3))
    with pytest.raises(ValueError, match="already running"):
        engine.add_request("dup", PROMPTS[1], _greedy(3))
    with pytest.raises(ValueError, match="maximum context length"):
        engine.add_request("long", "x " * 600, _greedy(3))
    with pytest.raises(ValueError, match="lora_request"):
        engine.add_request("lora", PROMPTS[0], _greedy(3), lora_request="adapter")
    with pytest.raises(InputValidationError, match="more than tokenization_kwargs max_length=2"):
        engine.add_request("max", PROMPTS[1], _greedy(3), tokenization_kwargs={"max_length": 2})
    assert engine.get_num_unfinished_requests() == 1
    outs = [o for outs in _run(engine) for o in outs]
    assert {o.request_id for o in outs} == {"dup"}
    # tokenization_kwargs as LLM.generate takes them.
    ids = engine.get_tokenizer().encode(PROMPTS[1])
    engine.add_request("cut", PROMPTS[1], _greedy(2), tokenization_kwargs={
        "truncation": True, "max_length": 3})
    assert [o for outs in _run(engine) for o in outs][-1].prompt_token_ids == ids[-3:]


def test_vllms_names() -> None:
    """``from cadence import LLMEngine, EngineArgs`` and ``LLM.llm_engine``, as vLLM's."""
    llm = LLM("tiny", async_scheduling=False)
    try:
        assert isinstance(llm.llm_engine, LLMEngine)
        assert llm.llm_engine.engine_core is llm.engine_core
        assert llm.llm_engine.get_tokenizer() is llm.get_tokenizer()
        assert isinstance(llm.llm_engine.args, EngineArgs)
    finally:
        llm.shutdown()


def test_wrong_params_and_ids_are_refused(engine: LLMEngine) -> None:
    from cadence import BeamSearchParams

    for params in (None, {"max_tokens": 3}, BeamSearchParams(beam_width=2, max_tokens=3)):
        for kwargs in (None, {"truncation": True}):
            with pytest.raises(InputValidationError, match="must be a SamplingParams"):
                engine.add_request("p", PROMPTS[0], params, tokenization_kwargs=kwargs)
    with pytest.raises(TypeError, match="request_id must be a string"):
        engine.add_request(7, PROMPTS[0], _greedy(3))
    assert not engine.has_unfinished_requests()


def test_an_exception_out_of_a_step_aborts_what_was_unfinished(engine: LLMEngine) -> None:
    """A Ctrl-C inside the model's forward pass: the requests it held are aborted (their blocks
    back, nothing left to step forever), and the engine serves the next ones as before."""
    core = engine.engine_core
    engine.add_request("a", PROMPTS[0], _greedy(6))
    engine.add_request("b", PROMPTS[1], _greedy(6))
    engine.step()
    run = core.runner.execute_model

    def interrupted(scheduler_output):
        core.runner.execute_model = run
        raise KeyboardInterrupt

    core.runner.execute_model = interrupted
    with pytest.raises(KeyboardInterrupt):
        for _ in range(10):  # under async scheduling the next launch may come a step later
            engine.step()
    assert not engine.has_unfinished_requests()
    _run(engine)  # whatever was in flight drains
    assert core.num_free_kv_blocks == core.num_kv_blocks - 1
    engine.add_request("c", PROMPTS[2], _greedy(5))
    got = [o for outs in _run(engine) for o in outs][-1]
    llm = LLM("tiny", async_scheduling=False)
    try:
        (want,) = llm.generate(PROMPTS[2], _greedy(5), use_tqdm=False)
    finally:
        llm.shutdown()
    assert list(got.outputs[0].token_ids) == list(want.outputs[0].token_ids)


def test_after_shutdown_nothing_is_taken(caplog) -> None:
    import logging

    engine = LLMEngine.from_engine_args(tiny_args())
    with caplog.at_level(logging.INFO, logger="cadence.engine.llm_engine"):
        engine.do_log_stats()
    assert "Running: 0 reqs, waiting: 0 reqs" in caplog.text
    engine.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.add_request("late", PROMPTS[0], _greedy(3))
    with pytest.raises(RuntimeError, match="shut down"):
        engine.step()
    llm = LLM("tiny", async_scheduling=False)
    llm.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        llm.llm_engine.add_request("late", PROMPTS[0], _greedy(3))


def test_prompt_text_names_a_token_prompt(engine: LLMEngine) -> None:
    """vLLM's ``prompt_text``: the text its outputs report for a prompt given as token ids; a
    text prompt already has its own, and anything but a string is refused."""
    tokens = {"prompt_token_ids": [5, 6, 7]}
    engine.add_request("named", tokens, _greedy(2), prompt_text="five six seven")
    engine.add_request("plain", tokens, _greedy(2))
    for bad, match in ((dict(prompt_text=7), "prompt_text must be a string"),):
        with pytest.raises(ValueError, match=match):
            engine.add_request("bad", tokens, _greedy(2), **bad)
    with pytest.raises(ValueError, match="prompt_text is only for a prompt given as token ids"):
        engine.add_request("bad", PROMPTS[0], _greedy(2), prompt_text="other")
    last = {o.request_id: o for step in _run(engine) for o in step}
    assert last["named"].prompt == "five six seven" and last["named"].finished
    assert last["plain"].prompt is None
    assert last["named"].prompt_token_ids == [5, 6, 7]
