"""LLM.beam_search against a beam search written here over transformers' logits (vLLM's
algorithm: 2 x width candidates a beam, the end token finishes, the best by length-penalized
score live on), on a random float32 checkpoint."""

from __future__ import annotations

import random

import pytest
import torch

from cadence import LLM, BeamSearchParams, SamplingParams
from tests.hf_models import VOCAB, build_hf_model


def _score(tokens: list[int], cum: float, eos: int, penalty: float) -> float:
    n = len(tokens) - (tokens[-1] == eos)
    return cum / n ** penalty


def reference(model, prompt: list[int], width: int, steps: int, eos: int,
              penalty: float = 1.0) -> list[tuple[list[int], float]]:
    beams: list[tuple[list[int], float]] = [(prompt, 0.0)]
    done: list[tuple[list[int], float]] = []
    for _ in range(steps):
        grown = []
        for tokens, cum in beams:
            with torch.no_grad():
                logits = model(torch.tensor([tokens])).logits[0, -1].double()
            top = torch.topk(torch.log_softmax(logits, -1), 2 * width)
            for lp, t in zip(top.values.tolist(), top.indices.tolist()):
                (done if t == eos else grown).append((tokens + [t], cum + lp))
        grown.sort(key=lambda b: _score(b[0], b[1], eos, penalty), reverse=True)
        beams = grown[:width]
        if not beams:
            break
    ranked = sorted(done + beams, key=lambda b: _score(b[0], b[1], eos, penalty), reverse=True)
    return ranked[:width]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A llama checkpoint whose end token is a likely candidate of the first prompt's second
    step, so that beams finish on it."""
    path = tmp_path_factory.mktemp("beam")
    model = build_hf_model("llama", path)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (5, 19, 33)]
    with torch.no_grad():
        first = int(model(torch.tensor([prompts[0]])).logits[0, -1].argmax())
        second = model(torch.tensor([prompts[0] + [first]])).logits[0, -1]
    eos = int(torch.topk(second, 3).indices[1])  # the second most likely
    model.generation_config.eos_token_id = eos
    model.generation_config.save_pretrained(path)
    return path, model, prompts, eos


@pytest.mark.parametrize(("width", "penalty", "async_scheduling"), [
    (1, 1.0, True), (3, 1.0, False), (3, 1.0, True), (4, 0.5, True), (2, 2.0, False),
])
def test_beams_match_the_reference(checkpoint, width: int, penalty: float,
                                   async_scheduling: bool) -> None:
    path, model, prompts, eos = checkpoint
    steps = 6
    llm = LLM(str(path), dtype="float32", skip_tokenizer_init=True, max_model_len=128,
              async_scheduling=async_scheduling)
    free = llm.engine_core.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompts],
                           BeamSearchParams(beam_width=width, max_tokens=steps,
                                            length_penalty=penalty))
    assert len(outs) == len(prompts)
    finished_on_eos = 0
    for out, prompt in zip(outs, prompts):
        expected = reference(model, prompt, width, steps, eos, penalty)
        assert [s.tokens for s in out.sequences] == [t for t, _ in expected]
        for seq, (tokens, cum) in zip(out.sequences, expected):
            assert seq.cum_logprob == pytest.approx(cum, abs=1e-4)
            assert len(seq.logprobs) == len(tokens) - len(prompt)
            assert seq.finish_reason == ("stop" if tokens[-1] == eos else "length")
            assert seq.text is None  # no tokenizer
            finished_on_eos += tokens[-1] == eos
    if width > 1 and penalty <= 1.0:  # (a strong penalty ranks the longer live beams first)
        assert finished_on_eos > 0  # the end token's path is exercised
    # Every step's requests are gone: their blocks are free (the cache may hold them).
    assert llm.engine_core.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == free


def test_concurrency_limit_and_a_bare_prompt_give_the_same_beams(checkpoint) -> None:
    path, model, prompts, eos = checkpoint
    llm = LLM(str(path), dtype="float32", skip_tokenizer_init=True, max_model_len=128)
    params = BeamSearchParams(beam_width=2, max_tokens=4)
    together = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    one_by_one = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params,
                                 concurrency_limit=1)
    assert [[s.tokens for s in o.sequences] for o in together] == \
        [[s.tokens for s in o.sequences] for o in one_by_one]
    (bare,) = llm.beam_search(prompts[1], params)  # a token list is one prompt
    assert [s.tokens for s in bare.sequences] == [s.tokens for s in together[1].sequences]


def test_beams_stop_at_the_context_end(checkpoint) -> None:
    path, model, prompts, eos = checkpoint
    llm = LLM(str(path), dtype="float32", skip_tokenizer_init=True, max_model_len=24)
    (out,) = llm.beam_search({"prompt_token_ids": prompts[1]},  # 19 tokens
                             BeamSearchParams(beam_width=2, max_tokens=50, ignore_eos=True))
    assert all(len(s.tokens) == 24 and s.finish_reason == "length" for s in out.sequences)


def test_text_is_the_prompt_and_the_answer() -> None:
    llm = LLM("tiny", max_model_len=128)
    (out,) = llm.beam_search(["Hello"], BeamSearchParams(beam_width=2, max_tokens=5))
    tok = llm.get_tokenizer()
    for seq in out.sequences:
        assert seq.text == tok.decode(seq.tokens) and seq.text.startswith("Hello")
    scores = [s.cum_logprob / len(s.tokens) for s in out.sequences]
    assert scores == sorted(scores, reverse=True)


def test_bad_calls_are_value_errors() -> None:
    llm = LLM("tiny", max_model_len=64)
    with pytest.raises(ValueError, match="beam_width"):  # 2 x 11 logprobs > max_logprobs 20
        llm.beam_search(["a"], BeamSearchParams(beam_width=11, max_tokens=2))
    with pytest.raises(ValueError, match="params"):
        llm.beam_search(["a"], {"beam_width": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="concurrency_limit"):
        llm.beam_search(["a"], BeamSearchParams(beam_width=2, max_tokens=2),
                        concurrency_limit=0)
    for bad in (None, 5, b"abc"):
        with pytest.raises(ValueError, match="prompts"):
            llm.beam_search(bad, BeamSearchParams(beam_width=2, max_tokens=2))  # type: ignore
    with pytest.raises(ValueError, match="maximum context length"):
        llm.beam_search([[5] * 64], BeamSearchParams(beam_width=2, max_tokens=2))


def test_async_llm_beam_search_matches_the_reference(checkpoint) -> None:
    # vLLM's EngineClient.beam_search: one finished RequestOutput, the best beams first.
    import asyncio

    from cadence import AsyncLLM
    from cadence.engine.engine_args import EngineArgs

    path, model, prompts, eos = checkpoint
    width, steps = 3, 5

    async def run() -> list:
        engine = AsyncLLM(EngineArgs(str(path), dtype="float32", skip_tokenizer_init=True,
                                     max_model_len=128))
        try:
            params = BeamSearchParams(beam_width=width, max_tokens=steps)
            outs = [o async for o in engine.beam_search({"prompt_token_ids": prompts[0]}, "b0",
                                                        params)]
            kept = BeamSearchParams(beam_width=width, max_tokens=steps,
                                    include_stop_str_in_output=True)
            outs += [o async for o in engine.beam_search({"prompt_token_ids": prompts[0]},
                                                         "b3", kept)]

            async def search(request_id: str):
                return [o async for o in engine.beam_search(
                    {"prompt_token_ids": prompts[0]}, request_id, params)][-1]

            async def plain():  # named as the first step of a search "same" could be named
                return [o async for o in engine.generate(
                    {"prompt_token_ids": prompts[1]},
                    SamplingParams(max_tokens=4, ignore_eos=True), "same-beam0-0")][-1]

            # The steps' requests have ids of their own: two searches under one id and a
            # request named like a step run side by side.
            outs += await asyncio.gather(search("same"), search("same"), plain())
            with pytest.raises(ValueError, match="beam_width"):
                async for _ in engine.beam_search({"prompt_token_ids": prompts[0]}, "b1",
                                                  BeamSearchParams(beam_width=11, max_tokens=2)):
                    pass
            with pytest.raises(ValueError, match="lora_request"):
                async for _ in engine.beam_search(prompts[0], "b2", params,
                                                  lora_request=object()):
                    pass
            assert not engine.has_unfinished_requests()
            return outs
        finally:
            engine.shutdown()

    out, kept_out, twin_a, twin_b, plain_out = asyncio.run(run())
    expected = reference(model, prompts[0], width, steps, eos, 1.0)
    assert out.finished and out.request_id == "b0" and out.prompt_token_ids == prompts[0]
    # vLLM's served search: a final end token is left out of the token ids (it is no
    # include_stop_str_in_output search), its step's logprobs row is kept.
    generated = [t[len(prompts[0]):] for t, _ in expected]
    assert [c.token_ids for c in out.outputs] == [
        g[:-1] if g[-1] == eos else g for g in generated]
    assert [len(c.logprobs) for c in out.outputs] == [len(g) for g in generated]
    assert [c.token_ids for c in kept_out.outputs] == generated  # include_stop_str_in_output
    assert [c.text for c in kept_out.outputs] == [c.text for c in out.outputs]
    for twin in (twin_a, twin_b):
        assert [c.token_ids for c in twin.outputs] == [c.token_ids for c in out.outputs]
    assert plain_out.finished and len(plain_out.outputs[0].token_ids) == 4
    assert [c.finish_reason for c in out.outputs] == [
        "stop" if t[-1] == eos else "length" for t, _ in expected]
    assert any(c.finish_reason == "stop" for c in out.outputs)  # the end token's path ran
    assert [c.finish_reason for c in out.outputs] == [
        "stop" if t[-1] == eos else "length" for t, _ in expected]
    for choice, (_, cum) in zip(out.outputs, expected):
        assert choice.cumulative_logprob == pytest.approx(cum, abs=1e-4)
