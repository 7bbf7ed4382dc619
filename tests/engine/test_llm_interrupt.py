"""``LLM.generate`` interrupted mid-run (Ctrl-C, an exception in output processing): nothing is
left in the engine, and the same LLM then generates what it would have anyway."""

from __future__ import annotations

from typing import Any

import pytest

from cadence import LLM, SamplingParams

PROMPTS = ["The quick brown fox", "Once upon a time", "Hello, my name is", "Numbers: 1 2 3"]


def _raise_at_call(llm: LLM, monkeypatch: pytest.MonkeyPatch, at: int,
                   error: type[BaseException]) -> list[int]:
    """Make the ``at``-th output-processing call raise ``error``; returns the call counter."""
    inner = llm.output_processor.process_outputs
    calls = [0]

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == at:
            raise error("interrupted")
        return inner(*args, **kwargs)

    monkeypatch.setattr(llm.output_processor, "process_outputs", failing)
    return calls


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_generate_interrupted_then_usable(error: type[BaseException], async_scheduling: bool,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM("tiny", device="cpu", max_model_len=128, max_num_seqs=2,
              async_scheduling=async_scheduling)
    core = llm.engine_core
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    reference = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    free = core.num_free_kv_blocks
    assert free == core.num_kv_blocks - 1

    # The fifth call: two requests running, two waiting (max_num_seqs=2), tokens delivered.
    calls = _raise_at_call(llm, monkeypatch, 5, error)
    with pytest.raises(error, match="interrupted"):
        llm.generate(PROMPTS, params, use_tqdm=False)
    assert calls == [5]
    monkeypatch.undo()
    # Nothing is left behind: no request in the engine or the output processor.
    assert not llm.output_processor.has_unfinished_requests()
    assert core.scheduler.get_num_unfinished_requests() == 0
    again = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == reference
    assert all(o.outputs[0].finish_reason == "length" for o in again)
    assert core.num_free_kv_blocks == free
    llm.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_ctrl_c_with_n_choices_aborts_every_child(async_scheduling: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during a generate of n > 1 requests: every child (running, waiting or not yet
    sent) leaves the engine, no KV block stays held, and the next generate gives what a fresh
    run gives."""
    llm = LLM("tiny", device="cpu", max_model_len=128, max_num_seqs=2,
              async_scheduling=async_scheduling)
    core = llm.engine_core
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=24, ignore_eos=True)
    reference = [[c.token_ids for c in o.outputs]
                 for o in llm.generate(PROMPTS[:2], params, use_tqdm=False)]
    free = core.num_free_kv_blocks
    assert free == core.num_kv_blocks - 1

    # The fourth call: children running and waiting, tokens delivered.
    calls = _raise_at_call(llm, monkeypatch, 4, KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt, match="interrupted"):
        llm.generate(PROMPTS[:2], params, use_tqdm=False)
    assert calls == [4]
    monkeypatch.undo()
    assert not llm.output_processor.has_unfinished_requests()
    assert not llm.output_processor.parents
    assert core.scheduler.get_num_unfinished_requests() == 0
    assert core.num_free_kv_blocks == free
    again = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    assert [[c.token_ids for c in o.outputs] for o in again] == reference
    assert core.num_free_kv_blocks == free
    llm.shutdown()


def test_ctrl_c_inside_a_compiled_pass_reaches_the_caller_as_ctrl_c(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGINT that lands inside a numba-compiled host pass (the step's input layout) comes
    out of the call as CPython's SystemError "returned a result with an exception set", caused
    by the KeyboardInterrupt; the caller sees the KeyboardInterrupt, and the engine is clean."""
    llm = LLM("tiny", device="cpu", max_model_len=128, max_num_seqs=2)
    core = llm.engine_core
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    reference = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    inner, calls = core.runner.execute_model, [0]

    def execute_model(so: Any) -> Any:
        calls[0] += 1
        if calls[0] == 3:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as interrupt:
                raise SystemError("CPUDispatcher(<function layout_step>) returned a result "
                                  "with an exception set") from interrupt
        return inner(so)

    monkeypatch.setattr(core.runner, "execute_model", execute_model)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, params, use_tqdm=False)
    monkeypatch.undo()
    assert not llm.output_processor.has_unfinished_requests()
    assert core.num_free_kv_blocks == core.num_kv_blocks - 1
    assert [o.outputs[0].token_ids
            for o in llm.generate(PROMPTS, params, use_tqdm=False)] == reference
    with pytest.raises(SystemError):  # any other SystemError stays what it is
        monkeypatch.setattr(core.runner, "execute_model",
                            lambda so: (_ for _ in ()).throw(SystemError("x")))
        llm.generate(PROMPTS[:1], params, use_tqdm=False)
    llm.shutdown()
