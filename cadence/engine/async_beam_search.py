"""Beam search over ``AsyncLLM`` (vLLM's served ``use_beam_search`` and its
``EngineClient.beam_search``): each step's beams run as one-token requests at once, and the
search ends in one finished ``RequestOutput`` whose outputs are the best beams, best first
(``cadence.beam_search`` has the rules)."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

from cadence.beam_search import BeamSearch, check_beam_search_params, step_candidates
from cadence.engine.input_worker import input_size
from cadence.engine.request_state import TokenTextCache
from cadence.outputs import CompletionOutput, Logprob, RequestOutput
from cadence.sampling_params import BeamSearchParams

if TYPE_CHECKING:
    from cadence.sampling_params import SamplingParams

# NOTE: ``engine`` is an ``AsyncLLM`` (not imported here: AsyncLLM.beam_search calls this).
AsyncLLM = Any

__all__ = ["beam_search_output", "search_prompt"]


async def search_prompt(engine: AsyncLLM, prompt: Any, request_id: str,
                        params: BeamSearchParams) -> RequestOutput:
    """vLLM's ``EngineClient.beam_search`` of one prompt: checked and tokenized as ``generate``
    checks a prompt (its steps' parameters), then searched; a ValueError names what is wrong."""
    check_beam_search_params(params, engine.input_processor.max_logprobs)
    step = params.step_params()
    request, prompt_text = await engine.run_cpu(
        input_size(prompt), engine.process_input, request_id, prompt, step, None, 0, False)
    return await beam_search_output(engine, request_id, request.prompt_token_ids, prompt_text,
                                    params, step)


async def _one_token(engine: AsyncLLM, prompt: dict[str, Any], params: SamplingParams,
                     request_id: str, priority: int) -> RequestOutput:
    final = None
    async for out in engine.generate(prompt, params, request_id, priority=priority):
        final = out
    assert final is not None
    return final


async def beam_search_output(
    engine: AsyncLLM,
    request_id: str,
    prompt_token_ids: list[int],
    prompt_text: str | None,
    params: BeamSearchParams,
    step_params: SamplingParams,
    *,
    priority: int = 0,
    cache_salt: str | None = None,
    skip_special_tokens: bool = True,
) -> RequestOutput:
    """The search for one prompt; ``step_params`` runs one token of a beam (one token,
    ``2 * beam_width`` logprobs, no text, FINAL_ONLY). An answer ended by the end token
    (vLLM's served search) keeps it in its token ids only with
    ``params.include_stop_str_in_output``, keeps that step's row in its logprobs either way,
    and never shows it in its text. Each step's requests have ids of their own (a random part:
    no other search or request can hold them). A failed step raises (``RequestFailedError``,
    ``EngineDeadError``); cancelling aborts the steps in flight (each ``generate`` aborts its
    own)."""
    search = BeamSearch(prompt_token_ids, params, engine.input_processor.eos_token_id,
                        engine.max_model_len)
    while beams := search.pending():
        prompts = [{"prompt_token_ids": b.tokens, "cache_salt": cache_salt} for b in beams]
        step_id = f"{request_id}-{uuid.uuid4().hex}"
        tasks = [asyncio.ensure_future(_one_token(
            engine, p, step_params, f"{step_id}-beam-{i}", priority))
            for i, p in enumerate(prompts)]
        try:
            outs = await asyncio.gather(*tasks)
        except BaseException:  # a failed step or a cancelled search: abort the siblings
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        search.advance([step_candidates(o) for o in outs])
    best = search.best()
    if not best:  # every step came back without candidates (aborted inside the engine)
        raise RuntimeError(f"beam search {request_id!r} ended with no sequence.")
    tokenizer = engine.tokenizer
    texts = TokenTextCache(tokenizer) if tokenizer is not None else None
    outputs = []
    for index, beam in enumerate(best):
        tokens = beam.tokens[search.prompt_len:]
        text = (tokenizer.decode(search.generated(beam, keep_end=False),
                                 skip_special_tokens=skip_special_tokens)
                if tokenizer is not None else "")
        rows = beam.logprobs[:len(tokens)]
        if texts is not None:  # the steps ran without text: each token's, as an answer's
            rows = [_with_text(row, texts, tokens[max(0, i - 4):i]) for i, row in enumerate(rows)]
        outputs.append(CompletionOutput(index, text, search.generated(beam), beam.cum_logprob,
                                        rows, finish_reason=beam.finish_reason,
                                        stop_reason=beam.stop_reason))
    return RequestOutput(request_id, prompt_text, list(prompt_token_ids), None, outputs,
                         finished=True)


def _with_text(row: dict[int, Logprob], texts: TokenTextCache, context: list[int]
               ) -> dict[int, Logprob]:
    """A candidate row (shared between beams: copied) with each token's text after
    ``context``, the beam's tokens before it (a piece of a character shows as an answer's)."""
    return {t: Logprob(lp.logprob, lp.rank, texts.in_context(t, context))
            for t, lp in row.items()}
