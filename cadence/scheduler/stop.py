"""Token-level stop conditions, checked after each appended token (vLLM v1 ``check_stop``).

Stop *strings* are not handled here: they need detokenized text (the output processor's job).
"""

from __future__ import annotations

from cadence.repetition import RepetitionTracker
from cadence.scheduler.request import Request, RequestStatus

REPETITION_STOP_REASON = "repetition_detected"  # vLLM's stop_reason for that finish


def check_stop(request: Request, max_model_len: int) -> bool:
    """Set the request's finished status and return True if its last token ends it."""
    output = request.output_token_ids
    num_output = len(output)
    params = request.sampling_params
    last_token_id = output[-1]
    # Under a grammar EOS is allowed only where the grammar is complete: nothing else could
    # follow, so it ends the request whatever ignore_eos and min_tokens say.
    if params.structured_outputs is not None and last_token_id == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    # min_tokens defers EOS, stop ids and max_tokens, but never the context-length limit: a
    # request at max_model_len cannot be scheduled again.
    if num_output >= params.min_tokens:
        if last_token_id == request.eos_token_id and not params.ignore_eos:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        stop_token_ids = params.stop_token_ids
        if stop_token_ids and last_token_id in stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last_token_id
            return True
        max_tokens = request.max_tokens
        if max_tokens is not None and num_output >= max_tokens:
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
    if request.num_prompt_tokens + num_output >= max_model_len:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    # After every length limit, as vLLM orders them; deferred by min_tokens as the others.
    repetition = params.repetition_detection
    if repetition is not None and repetition.enabled and num_output >= params.min_tokens:
        if request.repetition is None:
            request.repetition = RepetitionTracker(repetition)
        if request.repetition.repeats(output):
            request.status = RequestStatus.FINISHED_REPETITION
            request.stop_reason = REPETITION_STOP_REASON
            return True
    return False


def append_until_stop(
    request: Request, new_token_ids: list[int], max_model_len: int
) -> tuple[list[int], bool]:
    """Append a step's sampled tokens one by one, stopping at the first that ends the request:
    the tokens kept and whether it ended."""
    if len(new_token_ids) == 1:
        request.append_output_token_ids(new_token_ids[0])
        return new_token_ids, check_stop(request, max_model_len)
    for num_kept, token_id in enumerate(new_token_ids, 1):
        request.append_output_token_ids(token_id)
        if check_stop(request, max_model_len):
            return new_token_ids[:num_kept], True
    return new_token_ids, False
