"""The runner's persistent per-request state and the host-side preparation of one step's inputs.

Every request the runner knows holds one row (*slot*) from the moment it is added until it
finishes or is preempted; it keeps that row across steps. The slot indexes every per-request
array here and the GPU-resident ``last_sampled`` tokens, which the combine kernel reaches through
the step's request-index indirection. Rows stay condensed in ``[0, len(batch))``: removing a
request moves the last row into the hole, and the moves are handed to the runner
(``take_moves``) so it can move the device-resident state the same way, in stream order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cadence.sampling_params import SamplingParams
from cadence.scheduler.output import SchedulerOutput
from cadence.worker.sampler import plain_greedy_row
from cadence.worker.step_layout import layout_step

_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass
class StepInputs:
    """Host arrays for one step, in batch-row order (row b = the b-th scheduled request)."""

    req_ids: list[str]
    slots: np.ndarray  # [B] int32
    input_ids: np.ndarray  # [T] int64 (rows fed from the GPU hold a stale value; combine fixes)
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    query_start_loc: np.ndarray  # [B + 1] int32
    seq_lens: np.ndarray  # [B] int32
    block_tables: np.ndarray  # [B, max_blocks] int32
    last_token_index: np.ndarray  # [B] int32: flat index of each row's last token
    use_sampled: np.ndarray  # [B] int32: 1 if the row's last input is the last sampled token
    sample_rows: np.ndarray  # [R] int32: the rows that sample this step
    max_query_len: int
    max_seq_len: int
    # The rope table's rows where they are not the positions (longrope's long factors for a
    # request admitted past the original length); the device gets these, the rest of the
    # runner reads ``positions``.
    rope_positions: np.ndarray | None = None

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    @property
    def fresh_prompt(self) -> bool:
        """One request whose every token so far is in this step (no cached context)."""
        return len(self.req_ids) == 1 and int(self.seq_lens[0]) == self.num_tokens


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int,
                 block_size: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.max_blocks_per_req = max_blocks_per_req

        self.req_id_to_slot: dict[str, int] = {}
        self.slot_req_ids: list[str | None] = [None] * max_num_reqs
        # Row moves since the last take_moves(): final destination -> original source row.
        self._moves: dict[int, int] = {}

        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        # Tokens whose ids the host knows (prompt + outputs handed over on (re)admission).
        self.num_known = np.zeros(max_num_reqs, dtype=np.int64)
        # Tokens of the sequence including every one this runner sampled (even still on device).
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_prompt = np.zeros(max_num_reqs, dtype=np.int64)
        # Tokens known on (re)admission: what the request's prefill covers.
        self.num_admitted = np.zeros(max_num_reqs, dtype=np.int64)
        # longrope past its original length (set by the model runner): (original length, the long
        # table's row offset); None: positions are the rope table's rows.
        self.rope_switch: tuple[int, int] | None = None
        self.block_table = np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int32)
        self.params: list[SamplingParams | None] = [None] * max_num_reqs
        # Numeric sampling parameters per row, converted (and so checked) once on admission.
        self.temperature = np.zeros(max_num_reqs, dtype=np.float32)
        self.top_p = np.ones(max_num_reqs, dtype=np.float32)
        self.top_k = np.zeros(max_num_reqs, dtype=np.int64)
        self.min_p = np.zeros(max_num_reqs, dtype=np.float32)
        # Rows with a logits processor (penalties, bias, allowed ids, bad words): only these
        # are looked at each step.
        self.processed = np.zeros(max_num_reqs, dtype=np.bool_)
        # Rows that sample greedily with nothing else (sampler.plain_greedy_row): a step whose
        # sampling rows are all such builds no per-row sampling metadata.
        self.plain_greedy = np.zeros(max_num_reqs, dtype=np.bool_)
        # Requests refused on admission since the last take_failed(): id -> reason.
        self._failed: dict[str, str] = {}

    def warm_up(self) -> None:
        """Compile the layout pass for this batch's array types now (numba compiles on first
        call, ~1 s on a machine without its disk cache), not in the first request's step."""
        none32, none64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
        layout_step(none32, none64, none64, self.token_ids, self.block_table, self.num_known,
                    self.num_tokens, self.num_blocks, self.block_size)

    # Membership ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.req_id_to_slot)

    def add(self, req_id: str, prompt: list[int], outputs: list[int], params: SamplingParams,
            block_ids: list[int]) -> int:
        if req_id in self.req_id_to_slot:
            raise RuntimeError(f"request {req_id!r} is already in the batch")
        slot = len(self.req_id_to_slot)
        if slot >= self.max_num_reqs:
            raise RuntimeError(f"the batch holds at most {self.max_num_reqs} requests")
        n = len(prompt) + len(outputs)
        if n > self.max_model_len:
            raise ValueError(f"{n} tokens exceed max_model_len={self.max_model_len}")
        # Conversions that fail for out-of-range values fail here, before the row is taken.
        temperature = np.float32(min(params.temperature, _FLOAT32_MAX))  # huge: ~uniform
        top_p = np.float32(params.top_p)
        top_k = np.int64(params.top_k)
        min_p = np.float32(params.min_p)
        self._moves.pop(slot, None)  # a fresh request: nothing of the old row is kept
        self.req_id_to_slot[req_id] = slot
        self.slot_req_ids[slot] = req_id
        self.temperature[slot], self.top_p[slot], self.top_k[slot] = temperature, top_p, top_k
        self.min_p[slot] = min_p
        self.processed[slot] = params.needs_logits_processing
        self.plain_greedy[slot] = plain_greedy_row(params, temperature, top_p, top_k, min_p)
        row = self.token_ids[slot]
        # fromiter: a third less host time than converting the list through assignment.
        row[: len(prompt)] = np.fromiter(prompt, np.int64, len(prompt))
        if outputs:
            row[len(prompt) : n] = outputs
        self.num_known[slot] = n
        self.num_tokens[slot] = n
        self.num_prompt[slot] = len(prompt)
        self.num_admitted[slot] = n
        self.num_blocks[slot] = 0
        self.append_blocks(slot, block_ids)
        self.params[slot] = params
        return slot

    def remove(self, req_id: str) -> int | None:
        slot = self.req_id_to_slot.pop(req_id, None)
        if slot is None:
            return None
        last = len(self.req_id_to_slot)  # the row that moves into the hole
        if slot != last:
            self._move_row(last, slot)
        self.slot_req_ids[last] = None
        self.params[last] = None
        self._moves.pop(last, None)
        return slot

    def _move_row(self, src: int, dst: int) -> None:
        req_id = self.slot_req_ids[src]
        assert req_id is not None
        n = int(self.num_known[src])
        self.token_ids[dst, :n] = self.token_ids[src, :n]
        nb = int(self.num_blocks[src])
        self.block_table[dst, :nb] = self.block_table[src, :nb]
        for arr in (self.num_known, self.num_tokens, self.num_prompt, self.num_admitted,
                    self.num_blocks,
                    self.temperature, self.top_p, self.top_k, self.min_p, self.processed,
                    self.plain_greedy):
            arr[dst] = arr[src]
        self.params[dst] = self.params[src]
        self.slot_req_ids[dst] = req_id
        self.req_id_to_slot[req_id] = dst
        self._moves[dst] = self._moves.pop(src, src)

    def take_moves(self) -> tuple[list[int], list[int]]:
        """Row moves since the last call as (sources, destinations), to apply at once."""
        moves = [(src, dst) for dst, src in self._moves.items() if src != dst]
        self._moves.clear()
        return [m[0] for m in moves], [m[1] for m in moves]

    def append_blocks(self, slot: int, block_ids: list[int]) -> None:
        start = int(self.num_blocks[slot])
        end = start + len(block_ids)
        self.block_table[slot, start:end] = block_ids
        self.num_blocks[slot] = end

    # Per-step preparation --------------------------------------------------------------------
    def apply(self, so: SchedulerOutput) -> None:
        """Bring the persistent state up to date with one scheduler output."""
        for req_id in so.finished_req_ids:
            self.remove(req_id)
        for req_id in so.preempted_req_ids:
            self.remove(req_id)
        for new in so.scheduled_new_reqs:
            self.remove(new.req_id)  # resumed after preemption: its old state is stale
            try:
                self.add(new.req_id, new.prompt_token_ids, new.output_token_ids,
                         new.sampling_params, new.block_ids)
            except (ValueError, TypeError, OverflowError) as exc:
                # The request's own content is at fault: it fails alone, the step goes on.
                self.remove(new.req_id)
                self._failed[new.req_id] = f"{type(exc).__name__}: {exc}"
        cached = so.scheduled_cached_reqs
        slot_of = self.req_id_to_slot
        for req_id, new_blocks in zip(cached.req_ids, cached.new_block_ids):
            if new_blocks and req_id in slot_of:
                self.append_blocks(slot_of[req_id], new_blocks)

    def fail(self, req_id: str, reason: str) -> None:
        """Report a request as refused (it runs this step, and the scheduler then ends it)."""
        self._failed[req_id] = reason

    def take_failed(self) -> dict[str, str]:
        """Requests refused on admission since the last call (id -> reason)."""
        failed, self._failed = self._failed, {}
        return failed

    def prepare(self, so: SchedulerOutput) -> StepInputs:
        req_ids: list[str] = []
        computed: list[int] = []
        for new in so.scheduled_new_reqs:
            req_ids.append(new.req_id)
            computed.append(new.num_computed_tokens)
        cached = so.scheduled_cached_reqs
        req_ids.extend(cached.req_ids)
        computed.extend(cached.num_computed_tokens)

        slot_of = self.req_id_to_slot
        slot_list = [slot_of.get(r, -1) for r in req_ids]
        if -1 in slot_list:
            # Requests refused on admission (this step or one still in flight) run no tokens.
            known = [i for i, s in enumerate(slot_list) if s >= 0]
            req_ids = [req_ids[i] for i in known]
            computed = [computed[i] for i in known]
            slot_list = [slot_list[i] for i in known]
        slots = np.array(slot_list, dtype=np.int32)
        start = np.array(computed, dtype=np.int64)
        scheduled = so.num_scheduled_tokens
        n = np.array([scheduled[r] for r in req_ids], dtype=np.int64)
        (positions, input_ids, slot_mapping, qsl, last_token_index, use_sampled, sample_rows,
         seq_lens, max_query_len, max_seq_len, max_blocks) = layout_step(
            slots, start, n, self.token_ids, self.block_table, self.num_known, self.num_tokens,
            self.num_blocks, self.block_size)
        rope_positions = None
        if self.rope_switch is not None:
            original, offset = self.rope_switch
            # A request admitted with more than the original length runs every token, the
            # chunks of its prefill too, on the long factors (transformers rotates a prompt as
            # one pass); the model picks them itself where the sequence is already past it.
            long_rows = self.num_admitted[slots] > original
            if long_rows.any():
                rope_positions = positions + offset * np.repeat(long_rows, np.diff(qsl))
        return StepInputs(
            req_ids=req_ids,
            slots=slots,
            input_ids=input_ids,
            positions=positions,
            rope_positions=rope_positions,
            slot_mapping=slot_mapping,
            query_start_loc=qsl,
            seq_lens=seq_lens,
            block_tables=self.block_table[slots, : max(max_blocks, 1)],
            last_token_index=last_token_index,
            use_sampled=use_sampled,
            sample_rows=sample_rows,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
        )
