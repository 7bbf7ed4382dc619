"""The enums of sampling (vLLM's): what each output of a request carries, how its tokens are
drawn."""

from __future__ import annotations

import enum


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0  # every output carries everything generated so far
    DELTA = 1  # every output carries only what is new since the last one
    FINAL_ONLY = 2  # one output, when the request finishes


class SamplingType(enum.IntEnum):
    """vLLM's: how a request's tokens are drawn (``SamplingParams.sampling_type``)."""

    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2
