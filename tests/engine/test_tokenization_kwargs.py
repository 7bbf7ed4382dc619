"""vLLM's ``tokenization_kwargs`` of ``LLM.generate``, ``LLM.chat`` and ``AsyncLLM.generate``."""

from __future__ import annotations

import logging

import pytest

from cadence import LLM, SamplingParams
from cadence.engine.param_checks import InputValidationError
from cadence.engine.tokenization_kwargs import TokenizationKwargs

TEXT = "Hello World, hello there. " * 8


@pytest.fixture(scope="module")
def llm():
    engine = LLM("tiny", max_model_len=48, async_scheduling=False)
    yield engine
    engine.shutdown()


def _prompt_ids(llm, prompt, tokenization_kwargs=None, **params):
    sp = SamplingParams(max_tokens=4, temperature=0.0, **params)
    (out,) = llm.generate(prompt, sp, use_tqdm=False, tokenization_kwargs=tokenization_kwargs)
    return out.prompt_token_ids


def test_truncation_keeps_a_prompts_last_tokens(llm) -> None:
    ids = llm.get_tokenizer().encode(TEXT)
    assert len(ids) > 48
    # max_length: that many last tokens; without it as many as leave room for max_tokens.
    assert _prompt_ids(llm, TEXT, {"truncation": True, "max_length": 10}) == ids[-10:]
    assert _prompt_ids(llm, TEXT, {"truncation": "longest_first"}) == ids[-(48 - 4):]
    assert _prompt_ids(llm, TEXT, {"truncate_prompt_tokens": 7}) == ids[-7:]
    # -1 is max_length where one is given, from either side.
    assert _prompt_ids(llm, TEXT, {"max_length": 10, "truncate_prompt_tokens": -1}) == ids[-10:]
    assert _prompt_ids(llm, TEXT, {"max_length": 10}, truncate_prompt_tokens=-1) == ids[-10:]
    # The sampling parameters' truncation wins over this dict's (vLLM merges them so).
    assert _prompt_ids(llm, TEXT, {"truncate_prompt_tokens": 10},
                       truncate_prompt_tokens=5) == ids[-5:]
    # vLLM's reading of truncation: false changes nothing, "do_not_truncate" drops this dict's.
    assert _prompt_ids(llm, TEXT, {"truncation": False}, truncate_prompt_tokens=5) == ids[-5:]
    with pytest.raises(ValueError, match="maximum context length"):
        _prompt_ids(llm, TEXT, {"truncation": "do_not_truncate", "truncate_prompt_tokens": 7})
    # vLLM's truncation_side: "right" keeps the first tokens (either dict may say it).
    assert _prompt_ids(llm, TEXT, {"truncation": True, "max_length": 10,
                                   "truncation_side": "right"}) == ids[:10]
    assert _prompt_ids(llm, TEXT, {"truncation_side": "right"},
                       truncate_prompt_tokens=5) == ids[:5]
    with pytest.raises(ValueError, match="truncation_side must be 'left' or 'right'"):
        _prompt_ids(llm, TEXT, {"truncation_side": "up", "truncate_prompt_tokens": 5})
    # A truncation longer than max_length still leaves the prompt past it.
    with pytest.raises(InputValidationError, match="more than tokenization_kwargs max_length"):
        _prompt_ids(llm, TEXT, {"max_length": 10}, truncate_prompt_tokens=20)


def test_max_length_alone_bounds_the_prompt(llm) -> None:
    n = len(llm.get_tokenizer().encode("Hello World"))
    assert _prompt_ids(llm, "Hello World", {"max_length": n}) == (
        llm.get_tokenizer().encode("Hello World"))
    with pytest.raises(InputValidationError, match=f"more than tokenization_kwargs max_length="
                                                   f"{n - 1}"):
        _prompt_ids(llm, "Hello World", {"max_length": n - 1})


def test_lower_case_and_special_tokens(llm) -> None:
    tok = llm.get_tokenizer()
    assert _prompt_ids(llm, "Hello World", {"do_lower_case": True}) == tok.encode("hello world")
    kw = TokenizationKwargs.parse({"add_special_tokens": False, "do_lower_case": True})
    assert kw.prompt("Hi") == {"prompt": "hi", "add_special_tokens": False}
    assert kw.prompt({"prompt": "Hi", "cache_salt": "s"}) == {
        "prompt": "hi", "add_special_tokens": False, "cache_salt": "s"}
    assert kw.prompt([1, 2]) == [1, 2]  # token prompts are left as they are
    assert kw.prompt({"prompt_token_ids": [1], "prompt": "X"}) == {
        "prompt_token_ids": [1], "prompt": "X"}


def test_unknown_keys_are_ignored_with_a_warning(llm, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="cadence.engine.tokenization_kwargs"):
        assert _prompt_ids(llm, "Hello", {"padding": True, "truncation": "only_first"}
                           ) == llm.get_tokenizer().encode("Hello")
    assert "padding" in caplog.text and "truncation" in caplog.text


@pytest.mark.parametrize("kwargs, fragment", [
    ([("truncation", True)], "must be a dict"),
    ({1: 2, "padding": True}, "keys are names"),
    ({"add_special_tokens": 1}, "add_special_tokens must be true or false"),
    ({"max_length": 0}, "max_length must be an integer of at least 1"),
    ({"truncate_prompt_tokens": 0}, "-1 or at least 1"),
    ({"truncate_prompt_tokens": -2}, "at least -1"),
])
def test_bad_kwargs_are_refused_before_anything_runs(llm, kwargs, fragment) -> None:
    with pytest.raises(InputValidationError, match=fragment):
        _prompt_ids(llm, "Hello", kwargs)
    assert not llm.engine_core.scheduler.has_unfinished_requests()


def test_chat_takes_them_too(llm) -> None:
    messages = [{"role": "user", "content": TEXT}]
    sp = SamplingParams(max_tokens=2, temperature=0.0)
    (whole,) = llm.chat(messages, sp, use_tqdm=False, tokenization_kwargs={"truncation": True,
                                                                           "max_length": 12})
    (out,) = llm.chat(messages, SamplingParams(max_tokens=2, temperature=0.0,
                                               truncate_prompt_tokens=12), use_tqdm=False)
    assert len(whole.prompt_token_ids) == 12
    assert whole.prompt_token_ids == out.prompt_token_ids


async def test_async_llm_generate_takes_them_as_llm_does() -> None:
    """``AsyncLLM.generate(tokenization_kwargs=)`` (vLLM's): the same prompts as ``LLM``'s for the
    same dict, and a refused dict or a prompt past ``max_length`` leaves nothing in the engine."""
    from cadence.engine import AsyncLLM
    from tests.tiny import tiny_args

    engine = AsyncLLM.from_engine_args(tiny_args(max_model_len=48))
    try:
        ids = (await engine.get_tokenizer()).encode(TEXT)
        sp = SamplingParams(max_tokens=4, temperature=0.0)

        async def prompt_ids(rid: str, kwargs: dict, params: SamplingParams = sp) -> list[int]:
            outs = [o async for o in engine.generate(TEXT, params, rid,
                                                     tokenization_kwargs=kwargs)]
            return outs[-1].prompt_token_ids

        assert await prompt_ids("a", {"truncation": True, "max_length": 10}) == ids[-10:]
        assert await prompt_ids("b", {"truncation": True}) == ids[-(48 - 4):]
        assert await prompt_ids("c", {"truncate_prompt_tokens": 10},
                                SamplingParams(max_tokens=4, truncate_prompt_tokens=5)) == ids[-5:]
        lower = [o async for o in engine.generate("Hello World", sp, "d",
                                                  tokenization_kwargs={"do_lower_case": True})]
        assert lower[-1].prompt_token_ids == (await engine.get_tokenizer()).encode("hello world")
        for rid, kwargs, fragment in (
            ("e", {"max_length": 10, "truncate_prompt_tokens": 20},
             "more than tokenization_kwargs max_length=10"),
            ("f", {"max_length": 0}, "max_length must be an integer of at least 1"),
            ("g", [("truncation", True)], "must be a dict"),
        ):
            with pytest.raises(InputValidationError, match=fragment):
                async for _ in engine.generate(TEXT, sp, rid, tokenization_kwargs=kwargs):
                    pass
        with pytest.raises(InputValidationError, match="must be a SamplingParams"):
            await engine.add_request("h", TEXT, None, tokenization_kwargs={"truncation": True})
        assert not engine.output_processor.has_unfinished_requests()
        stats = await engine.get_scheduler_stats()
        assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
    finally:
        engine.shutdown()
