"""What the scheduler hands the model runner each step (vLLM v1 ``SchedulerOutput``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cadence.sampling_params import SamplingParams

if TYPE_CHECKING:
    from cadence.scheduler.block_pool import KVCacheBlock
    from cadence.scheduler.request import Request


@dataclass
class NewRequestData:
    """A request the runner has not seen, or one resumed after preemption (its state was dropped).

    ``prompt_token_ids`` is the original prompt; ``output_token_ids`` holds the tokens it already
    generated (non-empty only when resumed). The runner feeds both as known input tokens.
    """

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    """Requests already in the runner's persistent batch, scheduled again this step."""

    req_ids: list[str] = field(default_factory=list)
    # Blocks appended since the last step (None: no new block), per request.
    new_block_ids: list[list[int] | None] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    # req_id -> number of tokens scheduled this step, for every scheduled request.
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Requests that finished (or were aborted) since the last step: the runner drops their state.
    finished_req_ids: set[str] = field(default_factory=set)
    # Requests preempted this step: the runner drops their state; they come back as new.
    preempted_req_ids: set[str] = field(default_factory=set)
    num_common_prefix_blocks: int = 0

    @classmethod
    def empty(cls) -> SchedulerOutput:
        return cls([], CachedRequestData(), {}, 0)


def scheduled_request_data(
    scheduled_new: Sequence[Request],
    scheduled_running: Sequence[Request],
    new_blocks_of: dict[str, list[KVCacheBlock]],
    block_ids_of: Callable[[str], list[int]],
) -> tuple[list[NewRequestData], CachedRequestData]:
    """The step's requests as the runner takes them: new (or resumed) ones whole, with all
    their blocks (``block_ids_of``); running ones by id with the blocks added this step."""
    new_reqs = [
        NewRequestData(
            req_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            output_token_ids=list(req.output_token_ids),
            sampling_params=req.sampling_params,
            block_ids=block_ids_of(req.request_id),
            num_computed_tokens=req.num_computed_tokens,
        )
        for req in scheduled_new
    ]
    cached = CachedRequestData()
    req_ids = cached.req_ids
    new_block_ids = cached.new_block_ids
    num_computed = cached.num_computed_tokens
    for req in scheduled_running:
        req_id = req.request_id
        req_ids.append(req_id)
        blocks = new_blocks_of[req_id]
        new_block_ids.append([b.block_id for b in blocks] if blocks else None)
        num_computed.append(req.num_computed_tokens)
    return new_reqs, cached
