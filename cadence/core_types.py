"""Carriers between the engine front end, the engine core and the scheduler (vLLM v1 names)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from cadence.runner_output import LogprobsLists
from cadence.sampling_params import SamplingParams

__all__ = [
    "EngineCoreOutput",
    "EngineCoreOutputs",
    "EngineCoreRequest",
    "FinishReason",
    "SchedulerStats",
]


class FinishReason(enum.IntEnum):
    """Why a request finished (vLLM's names; ``str()`` gives the API's lower-case name)."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3  # the request failed inside the engine; the engine serves on
    REPETITION = 4  # its output repeated a pattern (SamplingParams.repetition_detection)

    def __str__(self) -> str:
        return self.name.lower()


@dataclass
class EngineCoreRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None = None
    arrival_time: float = field(default_factory=time.time)
    priority: int = 0
    # Prefix-cache isolation (vLLM's cache_salt): only requests with the same salt share blocks.
    cache_salt: str | None = None


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    # Rows parallel to new_token_ids: [(token_id, logprob), ...] sampled token first, then top-N;
    # with the sampled token's rank. None when the request did not ask for logprobs.
    new_logprobs: list[tuple[list[int], list[float], int]] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    # Why the request failed (finish_reason ERROR only).
    error: str | None = None
    # Prompt tokens scored this step (prompt_logprobs): (index in the prompt of the first,
    # rows as in new_logprobs: the prompt token first, then the top-N).
    new_prompt_logprobs: tuple[int, LogprobsLists] | None = None
    # With a request's first output: (reached the scheduler, first scheduled), monotonic clock.
    timing: tuple[float, float | None] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def __reduce__(self) -> tuple[type, tuple]:
        # A step's outputs cross a pipe to each front end (engine-core process): pickled as
        # constructor arguments they cost ~40% less to write and ~60% less to read than the
        # dataclass's default (a __dict__ per output).
        return (EngineCoreOutput, (self.request_id, self.new_token_ids, self.new_logprobs,
                                   self.finish_reason, self.stop_reason, self.num_cached_tokens,
                                   self.error, self.new_prompt_logprobs, self.timing))


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    prefix_cache_queries: int = 0  # tokens looked up in the prefix cache (cumulative)
    prefix_cache_hits: int = 0  # of which found (cumulative)
    num_preemptions: int = 0  # cumulative


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    scheduler_stats: SchedulerStats | None = None
    # Requests that finished in the engine core this step (for front ends that track them).
    finished_requests: set[str] = field(default_factory=set)
    timestamp: float = field(default_factory=time.monotonic)
