"""What a step hands back per request (vLLM v1 ``EngineCoreOutput``): the sampled tokens with
their logprobs, a finish reason, scored prompt tokens, the queue timing once; and why a request
whose every token was masked failed."""

from __future__ import annotations

from cadence.core_types import EngineCoreOutput
from cadence.runner_output import LogprobsLists
from cadence.scheduler.request import FinishReason, Request


def no_token_reason(request: Request) -> str:
    """Why a request whose row had every token masked failed, naming what constrained it."""
    params = request.sampling_params
    if params.structured_outputs is not None:
        return ("structured_outputs: no token fits the grammar under the request's other "
                "constraints (allowed_token_ids, bad_words), or the grammar cannot be completed.")
    if params.allowed_token_ids is not None:
        return ("allowed_token_ids: every allowed token was excluded (bad_words, logit_bias "
                "with the penalties); no token could be sampled.")
    return "logit_bias: the biases and penalties excluded every token; none could be sampled."


def request_output(
    request: Request,
    row: int,
    new_token_ids: list[int],
    finish_reason: FinishReason | None,
    logprobs: LogprobsLists | None,
    prompt_lps: tuple[int, LogprobsLists] | None,
) -> EngineCoreOutput:
    """``request``'s output of one step whose sampled tokens sit at ``row`` of the batch."""
    new_logprobs = None
    if (
        logprobs is not None
        and len(new_token_ids) == 1
        and request.sampling_params.num_logprobs is not None
    ):
        new_logprobs = [
            (
                logprobs.logprob_token_ids[row],
                logprobs.logprobs[row],
                logprobs.sampled_token_ranks[row],
            )
        ]
    timing = None
    if not request.timing_sent:
        request.timing_sent = True
        timing = (request.queued_time, request.scheduled_time)
    # Positional: (request_id, new_token_ids, new_logprobs, finish_reason, stop_reason,
    # num_cached_tokens, error, new_prompt_logprobs, timing); once per request per step.
    return EngineCoreOutput(
        request.request_id,
        new_token_ids,
        new_logprobs,
        finish_reason,
        request.stop_reason,
        request.num_cached_tokens,
        None,
        prompt_lps,
        timing,
    )
