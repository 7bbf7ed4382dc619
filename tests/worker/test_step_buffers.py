from __future__ import annotations

import numpy as np
import torch

from cadence.model.attention_metadata import AttentionMetadata
from cadence.runtime import get_device
from cadence.sampling_params import SamplingParams
from cadence.scheduler.output import CachedRequestData, NewRequestData, SchedulerOutput
from cadence.worker.input_batch import InputBatch
from cadence.worker.step_buffers import StepBuffers


def _decode_step(batch: InputBatch, n: int) -> SchedulerOutput:
    new = [
        NewRequestData(f"r{i}", list(range(1, 20 + i)), [], SamplingParams(), [i + 1, i + 50], 0)
        for i in range(n)
    ]
    so = SchedulerOutput(
        new, CachedRequestData(), {f"r{i}": 19 + i for i in range(n)}, sum(19 + i for i in range(n))
    )
    batch.apply(so)
    batch.prepare(so)
    cached = CachedRequestData([f"r{i}" for i in range(n)], [None] * n, [19 + i for i in range(n)])
    return SchedulerOutput([], cached, {f"r{i}": 1 for i in range(n)}, n)


def _upload_decode_step(
    n: int, padded_rows: int | None = None
) -> tuple[StepBuffers, AttentionMetadata]:
    """Upload the decode step of ``n`` prefilled requests through fresh buffers."""
    rt = get_device("cpu")
    batch = InputBatch(8, 64, 4, 16)
    so = _decode_step(batch, n)
    batch.apply(so)
    inp = batch.prepare(so)
    buf = StepBuffers(rt, rt.create_stream(), 64, 8, 4, torch.device("cpu"))
    return buf, buf.upload(inp, padded_rows=padded_rows)


def test_padded_decode_upload_fills_padding_rows():
    buf, md = _upload_decode_step(3, padded_rows=4)
    assert md.num_actual_tokens == 4
    assert md.block_tables.shape == (4, 4)
    np.testing.assert_array_equal(buf.query_start_loc[:5].numpy(), [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(buf.seq_lens[:4].numpy(), [20, 21, 22, 0])
    assert buf.slot_mapping[3].item() == -1
    assert buf.use_sampled[3].item() == 0
    np.testing.assert_array_equal(buf.use_sampled[:3].numpy(), [1, 1, 1])
    # Position 19 of r0 is in its second block (id 50): slot 50 * 16 + 3.
    assert buf.slot_mapping[0].item() == 50 * 16 + 3
    assert buf.counts.tolist() == [3, 3]


def test_unpadded_upload_uses_only_needed_block_columns():
    buf, md = _upload_decode_step(2)
    assert md.block_tables.shape == (2, 2)
    np.testing.assert_array_equal(md.block_tables.numpy(), [[1, 50], [2, 51]])
