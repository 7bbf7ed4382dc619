"""Persistent device input buffers of the runner and their pinned host staging.

Every step writes its index arrays into one of a few pinned host staging sets and copies them
into the same persistent device buffers with asynchronous host-to-device copies on the main
stream; a set is reused only after the event recorded behind its copies has completed, so the
host never waits on the GPU here in steady state. A decode step that runs as a CUDA graph pads
its rows up to the graph's size: padding rows have sequence length 0, slot -1 (no KV write) and
never take a sampled token.
"""

from __future__ import annotations

import numpy as np
import torch

from cadence.model.attention_metadata import AttentionMetadata
from cadence.worker.input_batch import StepInputs

_NUM_STAGING_SETS = 3
_INT64 = ("input_ids", "positions", "slot_mapping")
_INT32_ROWS = ("seq_lens", "req_slots", "last_token_index", "use_sampled", "sample_slots",
               "logits_index")


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

        self.input_ids = dev(max_num_tokens, torch.int64)
        self.positions = dev(max_num_tokens, torch.int64)
        self.slot_mapping = dev(max_num_tokens, torch.int64)
        self.query_start_loc = dev(max_num_reqs + 1, torch.int32)
        self.seq_lens = dev(max_num_reqs, torch.int32)
        self.req_slots = dev(max_num_reqs, torch.int32)
        self.last_token_index = dev(max_num_reqs, torch.int32)
        self.use_sampled = dev(max_num_reqs, torch.int32)
        self.sample_slots = dev(max_num_reqs, torch.int32)
        self.logits_index = dev(max_num_reqs, torch.int32)  # flat token index of sampling rows
        self.block_tables = dev(max_num_reqs, torch.int32, max_blocks)
        # Packed [rows, columns-used] upload area; a device copy scatters it into block_tables.
        self._block_tables_flat = dev(max_num_reqs * max_blocks, torch.int32)
        self.counts = dev(2, torch.int32)  # [rows to combine, rows to scatter]

        self._sets = []
        for _ in range(_NUM_STAGING_SETS):
            s = {name: host(max_num_tokens, torch.int64) for name in _INT64}
            s.update({name: host(max_num_reqs, torch.int32) for name in _INT32_ROWS})
            s["query_start_loc"] = host(max_num_reqs + 1, torch.int32)
            s["block_tables"] = host(max_num_reqs * max_blocks, torch.int32)
            s["counts"] = host(2, torch.int32)
            s = {k: (v, v.numpy()) for k, v in s.items()}
            self._sets.append((s, rt.create_event()))
        self._next = 0

    def _staging(self):
        staging, event = self._sets[self._next]
        self._next = (self._next + 1) % len(self._sets)
        event.synchronize()  # normally long complete: the set was used steps ago
        return staging, event

    def upload(self, inp: StepInputs, padded_rows: int | None = None) -> AttentionMetadata:
        """Stage and copy one step's inputs; pad to ``padded_rows`` decode rows if given."""
        staging, event = self._staging()
        b, t = inp.num_reqs, inp.num_tokens
        rows = padded_rows or b
        tokens = t + (rows - b)  # padding rows carry one token each
        nb = inp.block_tables.shape[1]  # columns this step uses; later ones are never read

        def put(name: str, values: np.ndarray, n: int, pad: int = 0) -> None:
            arr = staging[name][1]
            arr[: len(values)] = values
            arr[len(values) : n] = pad

        put("input_ids", inp.input_ids, tokens)
        put("positions", inp.positions, tokens)
        put("slot_mapping", inp.slot_mapping, tokens, pad=-1)
        qsl = staging["query_start_loc"][1]
        qsl[: b + 1] = inp.query_start_loc
        qsl[b + 1 : rows + 1] = np.arange(t + 1, tokens + 1)
        put("seq_lens", inp.seq_lens, rows)
        put("req_slots", inp.slots, rows)
        put("last_token_index", inp.last_token_index, rows)
        put("use_sampled", inp.use_sampled, rows)
        put("sample_slots", inp.slots[inp.sample_rows], len(inp.sample_rows))
        put("logits_index", inp.last_token_index[inp.sample_rows], len(inp.sample_rows))
        staging["block_tables"][1][: b * nb] = inp.block_tables[:, :nb].ravel()
        staging["counts"][1][:] = (b, len(inp.sample_rows))

        with self.main.context():
            # NOTE: pinned sources make these copies asynchronous; ordered on the main stream.
            for name, n in (("input_ids", tokens), ("positions", tokens),
                            ("slot_mapping", tokens), ("query_start_loc", rows + 1),
                            ("seq_lens", rows), ("req_slots", rows),
                            ("last_token_index", rows), ("use_sampled", rows),
                            ("sample_slots", len(inp.sample_rows)),
                            ("logits_index", len(inp.sample_rows)), ("counts", 2)):
                if n:
                    getattr(self, name)[:n].copy_(staging[name][0][:n], non_blocking=True)
            # NOTE: a contiguous upload, then a device-side strided copy: a strided host->device
            # copy would go through an unpinned temporary.
            flat = self._block_tables_flat[: b * nb]
            flat.copy_(staging["block_tables"][0][: b * nb], non_blocking=True)
            self.block_tables[:b, :nb].copy_(flat.view(b, nb))
        event.record(self.main)

        # A graph was captured over the full block-table width: pass that view to match.
        md = self.metadata(tokens, rows, inp.max_query_len,
                           self.max_blocks if padded_rows else nb, inp.max_seq_len)
        md.query_start_loc_cpu = torch.from_numpy(qsl[: rows + 1].copy())
        md.seq_lens_cpu = torch.from_numpy(staging["seq_lens"][1][:rows].copy())
        return md

    def metadata(self, tokens: int, rows: int, max_query_len: int, num_block_cols: int,
                 max_seq_len: int) -> AttentionMetadata:
        return AttentionMetadata(
            num_actual_tokens=tokens,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            query_start_loc=self.query_start_loc[: rows + 1],
            seq_lens=self.seq_lens[:rows],
            block_tables=self.block_tables[:rows, :num_block_cols],
            slot_mapping=self.slot_mapping[:tokens],
        )

    def fill_padding(self, rows: int) -> None:
        """Make the first ``rows`` rows a harmless all-padding decode batch (capture, warm-up)."""
        with self.main.context():
            self.input_ids[:rows].zero_()
            self.positions[:rows].zero_()
            self.slot_mapping[:rows].fill_(-1)
            self.query_start_loc[: rows + 1].copy_(
                torch.arange(rows + 1, dtype=torch.int32, device=self.device))
            self.seq_lens[:rows].zero_()
            self.use_sampled[:rows].zero_()
            self.counts.zero_()

    def close(self) -> None:
        for _, event in self._sets:
            event.synchronize()
            event.close()
        self._sets = []
