"""A request as the scheduler sees it (vLLM v1 ``Request``)."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from cadence.core_types import FinishReason
from cadence.repetition import RepetitionTracker
from cadence.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Everything after PREEMPTED is a finished state.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> FinishReason | None:
        return _FINISHED_REASON.get(status)


_FINISHED_REASON = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_IGNORED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
    RequestStatus.FINISHED_REPETITION: FinishReason.REPETITION,
}


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        block_hasher: Callable[[Request, list[bytes], int | None], list[bytes]] | None = None,
        grammar_ready: Callable[[], bool] | None = None,
        cache_salt: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.cache_salt = cache_salt  # mixed into the prefix-cache hash of the first block
        # Structured outputs: whether the grammar has compiled (vLLM's WAITING_FOR_FSM); the
        # request is not scheduled before. None: no grammar, or it is ready.
        self._grammar_ready = grammar_ready
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time if arrival_time is not None else time.time()
        self.priority = priority
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None

        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(self.prompt_token_ids)
        self.max_tokens = sampling_params.max_tokens

        self.num_computed_tokens = 0
        # Tokens scheduled whose sampled ids have not come back yet (async scheduling).
        self.num_output_placeholders = 0
        # Tokens still in flight at a forced reset (preemption): each is dropped on arrival.
        self.num_stale_output_tokens = 0
        self.num_cached_tokens = -1  # prefix-cache hits at first scheduling; -1 = not yet
        self.num_preemptions = 0
        # Monotonic times for the metrics: reached the scheduler, first scheduled; sent to the
        # front end once, with the request's first output.
        self.queued_time = time.monotonic()
        self.scheduled_time: float | None = None
        self.timing_sent = False

        # Prefix-cache hashes of the leading full blocks, computed when first needed
        # (hash_blocks): a prompt's blocks are hashed after its first step has launched, not
        # on its way to the GPU.
        self._block_hashes: list[bytes] = []
        self._block_hasher = block_hasher
        # longrope: its keys take the long factors (Scheduler's rope_switch_len); part of its
        # blocks' hashes, so no block is shared across the two rotations.
        self.rope_long = False
        # SamplingParams.repetition_detection's check, made at its first use.
        self.repetition: RepetitionTracker | None = None

    @property
    def waiting_for_grammar(self) -> bool:
        ready = self._grammar_ready
        if ready is None:
            return False
        if ready():
            self._grammar_ready = None
            return False
        return True

    # Token views -----------------------------------------------------------------------------
    @property
    def output_token_ids(self) -> list[int]:
        return self._output_token_ids

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        # Runs once per request per step in update_from_output: kept free of extra calls.
        if isinstance(token_ids, int):
            self._output_token_ids.append(token_ids)
            self._all_token_ids.append(token_ids)
        else:
            self._output_token_ids.extend(token_ids)
            self._all_token_ids.extend(token_ids)

    @property
    def block_hashes(self) -> list[bytes]:
        """The prefix-cache hash of every full block (of the tokens known so far)."""
        return self.hash_blocks(None)

    def hash_blocks(self, num_blocks: int | None) -> list[bytes]:
        """The block hash list, extended to cover at least the first ``num_blocks`` blocks
        (every full block when None) as far as full blocks go. The list is the request's own:
        it only grows, and a longer prefix than asked for may already be there."""
        hashes = self._block_hashes
        hasher = self._block_hasher
        if hasher is not None and (num_blocks is None or len(hashes) < num_blocks):
            hashes.extend(hasher(self, hashes, num_blocks))
        return hashes

    def take_long_rope(self) -> None:
        """Rotate this request's keys with longrope's long factors from now on; it holds no
        KV blocks (not admitted yet, or preempted), and its block hashes start over."""
        self.rope_long = True
        self._block_hashes = []

    # Status ----------------------------------------------------------------------------------
    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> FinishReason | None:
        return RequestStatus.get_finished_reason(self.status)

    def __lt__(self, other: Request) -> bool:
        # Heap order for the priority queue: (priority, arrival_time, request_id).
        return (self.priority, self.arrival_time, self.request_id) < (
            other.priority,
            other.arrival_time,
            other.request_id,
        )

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )
