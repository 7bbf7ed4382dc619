"""Persistent device input buffers of the runner and their pinned host staging.

Every step writes its index arrays into one of a few pinned host staging sets and copies them
into the same persistent device buffers with asynchronous host-to-device copies on the main
stream: raw ``cudaMemcpyAsync`` calls on addresses taken once (a torch copy costs tens of
microseconds of host time each), the per-token int64 arrays (rows of one block) as one 2D copy
of the tokens in use, the per-row int32 arrays as one block, the block table as one 2D copy of
the columns in use: three copies a step. A set is reused only after the event recorded behind
its copies has completed, so the host never waits on the GPU here in steady state. A step that
runs as a CUDA graph pads its tokens and rows up to the graph's bucket: padding tokens write no
KV (slot -1), padding rows have an empty query range and sequence length 0, and neither ever
takes a sampled token.
"""

from __future__ import annotations

import numpy as np
import torch

from cadence.model.attention_metadata import AttentionMetadata, OutputRows
from cadence.worker.input_batch import StepInputs
from cadence.worker.step_layout import ROW_ARRAYS, stage_step

_NUM_STAGING_SETS = 3
_INT64 = ("input_ids", "positions", "slot_mapping")
_INT32_ROWS = ("seq_lens", "req_slots", "last_token_index", "use_sampled", "sample_slots",
               "logits_index")
_ALIGN = 32  # int32 elements: every array of the row block starts 128-byte aligned


def _row_block_layout(max_num_reqs: int) -> tuple[dict[str, tuple[int, int]], int]:
    """Offset and length of each int32 array in the row block, and the block's length."""
    lengths = {"query_start_loc": max_num_reqs + 1, **dict.fromkeys(_INT32_ROWS, max_num_reqs),
               "counts": 2}
    layout, offset = {}, 0
    for name, n in lengths.items():
        layout[name] = (offset, n)
        offset += -(-n // _ALIGN) * _ALIGN
    return layout, offset


class StepBuffers:
    def __init__(self, rt, main, max_num_tokens: int, max_num_reqs: int, max_blocks: int,
                 device: torch.device) -> None:
        self.rt = rt
        self.main = main
        self.device = device
        self.max_num_reqs = max_num_reqs
        self.max_blocks = max_blocks
        pin = device.type == "cuda"

        def dev(n, dtype, *rest):
            return torch.zeros(n, *rest, dtype=dtype, device=device)

        def host(n, dtype, *rest):
            return torch.zeros(n, *rest, dtype=dtype, pin_memory=pin)

        # input_ids, positions, slot_mapping: the rows of one block, uploaded in one 2D copy;
        # rows 128-byte aligned, as kernels specialize on their arguments' alignment.
        pitch = -(-max_num_tokens // 16) * 16
        self._tokens = dev(len(_INT64), torch.int64, pitch)
        for i, name in enumerate(_INT64):
            setattr(self, name, self._tokens[i, :max_num_tokens])
        # query_start_loc, seq_lens, req_slots, last_token_index, use_sampled, sample_slots,
        # logits_index (flat token index of sampling rows) and counts ([rows to combine, rows to
        # scatter]): views of one int32 block, so that a step uploads them in one copy.
        layout, block_len = _row_block_layout(max_num_reqs)
        self._rows = dev(block_len, torch.int32)
        for name, (offset, n) in layout.items():
            setattr(self, name, self._rows[offset : offset + n])
        self.block_tables = dev(max_num_reqs, torch.int32, max_blocks)
        # 0, 1, 2, ...: the query ranges of a decode layout (``output_rows``); never written.
        self.row_starts = torch.arange(max_num_reqs + 1, dtype=torch.int32, device=device)
        # Device addresses of the copies' destinations (fixed: graphs read these buffers).
        self._dst = {"tokens": self._tokens.data_ptr(), "rows": self._rows.data_ptr(),
                     "block_tables": self.block_tables.data_ptr()}
        self._rows_nbytes = block_len * 4
        self._row_offsets = np.array([layout[name][0] for name in ROW_ARRAYS], dtype=np.int64)
        self._bt_pitch = max_blocks * 4
        self._tokens_pitch = pitch * 8

        self._sets = []
        for _ in range(_NUM_STAGING_SETS):
            tokens_block = host(len(_INT64), torch.int64, pitch)
            s = {name: tokens_block[i, :max_num_tokens] for i, name in enumerate(_INT64)}
            s["tokens"] = tokens_block
            rows_block = host(block_len, torch.int32)
            s["rows"] = rows_block
            s.update({name: rows_block[offset : offset + n]
                      for name, (offset, n) in layout.items()})
            s["block_tables"] = host(max_num_reqs, torch.int32, max_blocks)
            src = {name: s[name].data_ptr() for name in ("tokens", "rows", "block_tables")}
            s = {k: v.numpy() for k, v in s.items()}
            # NOTE: the staging tensors stay alive through their numpy views.
            self._sets.append((s, src, rt.create_event()))
        self._next = 0

    def warm_up(self) -> None:
        """Compile the staging pass for these buffers' array types now (numba compiles on
        first call), not in the first request's step. Writes an empty step into a set."""
        staging = self._sets[0][0]
        none32, none64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
        stage_step(staging["input_ids"], staging["positions"], staging["slot_mapping"],
                   staging["rows"], self._row_offsets, staging["block_tables"], none64, none64,
                   none64, np.zeros(1, np.int32), none32, none32, none32, none32, none32,
                   np.zeros((0, 1), np.int32), 0, 0)

    def _staging(self):
        staging, src, event = self._sets[self._next]
        self._next = (self._next + 1) % len(self._sets)
        event.synchronize()  # normally long complete: the set was used steps ago
        return staging, src, event

    def upload(self, inp: StepInputs, padded_tokens: int | None = None,
               padded_rows: int | None = None, metadata: bool = True) -> AttentionMetadata | None:
        """Stage and copy one step's inputs; return the attention metadata of a forward over
        them (None with ``metadata=False``: a graph replay reads the buffers it was captured
        with, and the views would only cost host time).

        For a graph bucket, pad to ``padded_tokens`` tokens and ``padded_rows`` rows: padding
        tokens (past the last row's) belong to no row and write no KV (slot -1); padding rows
        have an empty query range and sequence length 0, so no kernel reads their block table.
        """
        b, t = inp.num_reqs, inp.num_tokens
        tokens = padded_tokens or t
        rows = padded_rows or b
        max_tokens = self.input_ids.shape[0]
        if tokens > max_tokens or rows > self.max_num_reqs:
            # NOTE: the raw copies below check nothing: this bound keeps them in the buffers.
            raise ValueError(f"a step of {tokens} tokens and {rows} rows does not fit buffers "
                             f"of {max_tokens} tokens and {self.max_num_reqs} rows")
        staging, src, event = self._staging()
        nb = inp.block_tables.shape[1]  # columns this step uses; later ones are never read
        stage_step(staging["input_ids"], staging["positions"], staging["slot_mapping"],
                   staging["rows"], self._row_offsets, staging["block_tables"], inp.input_ids,
                   inp.positions if inp.rope_positions is None else inp.rope_positions,
                   inp.slot_mapping, inp.query_start_loc, inp.seq_lens,
                   inp.slots, inp.last_token_index, inp.use_sampled, inp.sample_rows,
                   inp.block_tables, tokens, rows)

        # NOTE: pinned sources make these copies asynchronous; ordered on the main stream.
        dst, main = self._dst, self.main
        tokens_pitch, bt_pitch = self._tokens_pitch, self._bt_pitch
        main.copy_2d_ptr_async(dst["tokens"], tokens_pitch, src["tokens"], tokens_pitch,
                               tokens * 8, len(_INT64))
        # The whole row block: past each array's rows this step it carries values of an
        # earlier step, which nothing reads (each reader stops at its row count).
        main.copy_ptr_async(dst["rows"], src["rows"], self._rows_nbytes)
        main.copy_2d_ptr_async(dst["block_tables"], bt_pitch, src["block_tables"], bt_pitch,
                               nb * 4, b)
        event.record(self.main)
        if not metadata:
            return None

        # A graph was captured over the full block-table width: pass that view to match.
        graph = padded_tokens is not None
        # NOTE: fresh_prompt stays False: dense attention is for the fresh graphs' bucketed
        # shapes only (model/dense_prefill.py).
        md = self.metadata(tokens, rows, inp.max_query_len,
                           self.max_blocks if graph else nb, inp.max_seq_len)
        if self.device.type != "cuda":
            # Host copies for the torch reference backend's loop (the Triton backend never
            # reads them; the reference on CUDA reads the device tensors instead, a sync).
            md.query_start_loc_cpu = torch.from_numpy(
                staging["query_start_loc"][: rows + 1].copy())
            md.seq_lens_cpu = torch.from_numpy(staging["seq_lens"][:rows].copy())
        return md

    def metadata(self, tokens: int, rows: int, max_query_len: int, num_block_cols: int,
                 max_seq_len: int, fresh_prompt: bool = False) -> AttentionMetadata:
        return AttentionMetadata(
            num_actual_tokens=tokens,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            query_start_loc=self.query_start_loc[: rows + 1],
            seq_lens=self.seq_lens[:rows],
            block_tables=self.block_tables[:rows, :num_block_cols],
            slot_mapping=self.slot_mapping[:tokens],
            fresh_prompt=fresh_prompt,
        )

    def output_rows(self, rows: int, num_block_cols: int, max_seq_len: int) -> OutputRows:
        """The last token of each of the first ``rows`` rows, as the model's ``rows``: views of
        the uploaded step (a graph reads them at replay)."""
        md = AttentionMetadata(
            num_actual_tokens=rows,
            max_query_len=1,
            max_seq_len=max_seq_len,
            query_start_loc=self.row_starts[: rows + 1],
            seq_lens=self.seq_lens[:rows],
            block_tables=self.block_tables[:rows, :num_block_cols],
            slot_mapping=self.slot_mapping[:rows],  # not read: the pass stores every K/V
        )
        return OutputRows(self.last_token_index[:rows], md)

    def fill_padding(self, tokens: int, rows: int) -> None:
        """Make the first ``tokens`` tokens and ``rows`` rows a harmless all-padding step
        (capture, warm-up): no KV writes, empty query ranges, nothing to combine or scatter."""
        with self.main.context():
            self.input_ids[:tokens].zero_()
            self.positions[:tokens].zero_()
            self.slot_mapping[:tokens].fill_(-1)
            self.query_start_loc[: rows + 1].zero_()
            self.seq_lens[:rows].zero_()
            self.use_sampled[:rows].zero_()
            self.counts.zero_()

    def close(self) -> None:
        for _, _, event in self._sets:
            event.synchronize()
            event.close()
        self._sets = []
