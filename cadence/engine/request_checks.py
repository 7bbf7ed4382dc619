"""Checks of a request against the engine's configuration (shared by the engine core and
front ends that cannot reach into it)."""

from __future__ import annotations

import math

from cadence.core_types import EngineCoreRequest


def check_request_fits(req: EngineCoreRequest, num_kv_blocks: int, block_size: int) -> None:
    """Raise ValueError naming the parameter when the request cannot be served: more tokens
    than the whole KV cache holds. (A priority under the fcfs policy is taken and plays no
    part in the order, as in vLLM v1.)"""
    max_tokens = req.sampling_params.max_tokens or 0
    # The last token sampled is never fed back: it needs no slot.
    total = len(req.prompt_token_ids) + max(max_tokens - 1, 0)
    usable = num_kv_blocks - 1  # block 0 is the reserved null block
    if math.ceil(total / block_size) > usable:
        raise ValueError(
            f"max_tokens: the request needs {total} tokens of KV cache (the prompt and every "
            f"completion token but the last) but the whole cache holds {usable * block_size} "
            "tokens; reduce the prompt or max_tokens."
        )
