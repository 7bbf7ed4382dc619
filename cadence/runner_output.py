"""What the model runner hands back each step (vLLM v1 ``ModelRunnerOutput``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class LogprobsLists:
    """Per row: token ids and logprobs (the sampled token first, then the top-N most likely)
    and the rank of the sampled token (1 = most likely)."""

    logprob_token_ids: list[list[int]]
    logprobs: list[list[float]]
    sampled_token_ranks: list[int]


# What a row samples, in the host's copy only, when every token of its row was masked (its
# constraints left none): the scheduler fails that request. The device keeps a real id, which
# the next step may already read as its input.
NO_TOKEN = -1


@dataclass
class ModelRunnerOutput:
    # Requests of this step in the runner's row order.
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    # Per request: [token] if it sampled this step, [] if it did not (a partial prefill chunk).
    sampled_token_ids: list[list[int]]
    # Rows parallel to req_ids (empty lists for rows that did not sample); None when no request
    # of this step asked for logprobs.
    logprobs: LogprobsLists | None = None
    num_nans: dict[str, int] = field(default_factory=dict)
    # Requests that scored prompt tokens this step: id -> (index in the prompt of the first
    # scored token, one row per scored token: the token itself first, then the top-k).
    prompt_logprobs: dict[str, tuple[int, LogprobsLists]] = field(default_factory=dict)
    # Requests the runner refused (their own content was at fault): id -> reason. The
    # scheduler finishes each with an error; every other request of the step goes on.
    failed_requests: dict[str, str] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> ModelRunnerOutput:
        return cls([], {}, [])


class AsyncModelRunnerOutput(Protocol):
    """A step's output whose device-to-host copy may still be in flight."""

    def get_output(self) -> ModelRunnerOutput:
        """Wait for this step's copy (and only that) and return the host-side output."""
        ...


@dataclass
class ReadyOutput:
    """An output that is already on the host (CPU backend, or an empty step)."""

    output: ModelRunnerOutput

    def get_output(self) -> ModelRunnerOutput:
        return self.output


@dataclass
class WithFailedRequests:
    """A step's output plus the requests the runner refused while preparing it."""

    inner: AsyncModelRunnerOutput
    failed: dict[str, str]

    def get_output(self) -> ModelRunnerOutput:
        out = self.inner.get_output()
        out.failed_requests.update(self.failed)
        return out
