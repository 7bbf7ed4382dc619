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
    return buf, buf.upload(inp, padded_tokens=padded_rows, padded_rows=padded_rows)


def test_padded_decode_upload_fills_padding_rows():
    buf, md = _upload_decode_step(3, padded_rows=4)
    assert md.num_actual_tokens == 4
    assert md.block_tables.shape == (4, 4)
    # The padding row has an empty query range; the padding token belongs to no row.
    np.testing.assert_array_equal(buf.query_start_loc[:5].numpy(), [0, 1, 2, 3, 3])
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


def test_mixed_bucket_upload_pads_tokens_and_rows():
    rt = get_device("cpu")
    batch = InputBatch(8, 64, 4, 16)
    new = [NewRequestData("a", list(range(1, 11)), [], SamplingParams(), [3], 0),
           NewRequestData("b", list(range(1, 31)), [], SamplingParams(), [4, 5], 0)]
    # "a" runs its whole 10-token prompt (it samples), "b" a first chunk of 7 (it does not).
    so = SchedulerOutput(new, CachedRequestData(), {"a": 10, "b": 7}, 17)
    batch.apply(so)
    inp = batch.prepare(so)
    buf = StepBuffers(rt, rt.create_stream(), 64, 8, 4, torch.device("cpu"))
    md = buf.upload(inp, padded_tokens=32, padded_rows=8)
    assert md.num_actual_tokens == 32 and md.seq_lens.shape == (8,)
    assert md.block_tables.shape == (8, 4)  # the full width, as the graph was captured
    np.testing.assert_array_equal(buf.query_start_loc[:9].numpy(), [0, 10, 17] + [17] * 6)
    np.testing.assert_array_equal(buf.seq_lens[:8].numpy(), [10, 7, 0, 0, 0, 0, 0, 0])
    assert (buf.slot_mapping[17:32] == -1).all() and (buf.slot_mapping[:17] >= 0).all()
    assert (buf.input_ids[17:32] == 0).all() and (buf.positions[17:32] == 0).all()
    assert buf.counts.tolist() == [2, 1]  # two rows to combine, one sampling row
    assert buf.logits_index[0].item() == 9  # "a"'s last token


def test_row_arrays_upload_as_one_block_and_later_steps_read_their_own_rows():
    """The per-row arrays are views of one block (one host-to-device copy per step); a step of
    fewer rows after one of more reads its own values up to its row counts, whatever the
    earlier step left past them."""
    rt = get_device("cpu")
    batch = InputBatch(8, 64, 4, 16)
    buf = StepBuffers(rt, rt.create_stream(), 64, 8, 4, torch.device("cpu"))
    names = ("query_start_loc", "seq_lens", "req_slots", "last_token_index", "use_sampled",
             "sample_slots", "logits_index", "counts")
    storages = {getattr(buf, n).untyped_storage().data_ptr() for n in names}
    assert len(storages) == 1
    base = buf.query_start_loc.data_ptr()
    # Each array 128 bytes from the block's start (16-byte aligned, as kernels specialize).
    assert all((getattr(buf, n).data_ptr() - base) % 128 == 0 for n in names) and base % 16 == 0
    so = _decode_step(batch, 3)
    batch.apply(so)
    buf.upload(batch.prepare(so))
    assert buf.counts.tolist() == [3, 3]
    np.testing.assert_array_equal(buf.seq_lens[:3].numpy(), [20, 21, 22])
    # Then a step of one request (another batch) through the same buffers.
    one = InputBatch(8, 64, 4, 16)
    so = _decode_step(one, 1)
    one.apply(so)
    inp = one.prepare(so)
    md = buf.upload(inp)
    assert buf.counts.tolist() == [1, 1]
    np.testing.assert_array_equal(md.query_start_loc.numpy(), [0, 1])
    np.testing.assert_array_equal(md.seq_lens.numpy(), [20])
    assert buf.req_slots[0].item() == inp.slots[0]
    assert buf.logits_index[0].item() == 0 and buf.use_sampled[0].item() == 1
    assert buf.slot_mapping[0].item() == 50 * 16 + 3


def test_upload_refuses_a_step_larger_than_its_buffers():
    """The raw copies check nothing: upload bounds the step by the buffers first."""
    import pytest

    rt = get_device("cpu")
    batch = InputBatch(8, 64, 4, 16)
    so = _decode_step(batch, 3)
    batch.apply(so)
    inp = batch.prepare(so)
    buf = StepBuffers(rt, rt.create_stream(), 64, 8, 4, torch.device("cpu"))
    with pytest.raises(ValueError, match="65 tokens"):
        buf.upload(inp, padded_tokens=65, padded_rows=4)
    with pytest.raises(ValueError, match="9 rows"):
        buf.upload(inp, padded_tokens=8, padded_rows=9)
    assert buf.upload(inp, padded_tokens=64, padded_rows=8).num_actual_tokens == 64


def test_padding_overwrites_what_an_earlier_larger_step_left_in_the_staging_set():
    """Staging sets rotate (three of them): a small padded step lands in a set that held a
    larger one, whose values must not leak into the padding (ids and positions 0, slot -1,
    empty query ranges at the step's end, zero lengths and flags)."""
    rt = get_device("cpu")
    batch = InputBatch(8, 64, 4, 16)
    big = [NewRequestData(f"g{i}", list(range(1 + i, 13 + i)), [], SamplingParams(),
                          [10 + i], 0) for i in range(4)]
    so_big = SchedulerOutput(big, CachedRequestData(), {f"g{i}": 12 for i in range(4)}, 48)
    batch.apply(so_big)
    big_inp = batch.prepare(so_big)
    small = [NewRequestData("s", list(range(2, 7)), [], SamplingParams(), [30], 0)]
    so_small = SchedulerOutput(small, CachedRequestData(), {"s": 5}, 5)
    batch.apply(so_small)
    small_inp = batch.prepare(so_small)
    buf = StepBuffers(rt, rt.create_stream(), 64, 8, 4, torch.device("cpu"))
    for _ in range(3):  # every set holds the big step once
        buf.upload(big_inp, padded_tokens=48, padded_rows=8)
    assert buf.seq_lens[:4].tolist() == [12] * 4
    buf.upload(small_inp, padded_tokens=48, padded_rows=8, metadata=False)
    assert buf.input_ids[:5].tolist() == [2, 3, 4, 5, 6]
    assert buf.positions[:5].tolist() == [0, 1, 2, 3, 4]
    assert buf.slot_mapping[:5].tolist() == [30 * 16 + i for i in range(5)]
    assert (buf.input_ids[5:48] == 0).all() and (buf.positions[5:48] == 0).all()
    assert (buf.slot_mapping[5:48] == -1).all()
    assert buf.query_start_loc[:9].tolist() == [0] + [5] * 8
    assert buf.seq_lens[:8].tolist() == [5] + [0] * 7
    assert buf.use_sampled[:8].tolist() == [0] * 8
    assert buf.last_token_index[:8].tolist() == [4] + [0] * 7
    assert buf.req_slots[1:8].tolist() == [0] * 7
    assert buf.counts.tolist() == [1, 1] and buf.logits_index[0].item() == 4
    slot = buf.req_slots[0].item()
    assert buf.sample_slots[0].item() == slot
    assert buf.block_tables[0, 0].item() == 30


def test_warm_up_compiles_the_signatures_a_real_step_uses(monkeypatch):
    """The runner warms the two compiled host passes at start-up; a real step afterwards must
    call them with the argument types the warm-up compiled (numba specializes on them), so the
    first request's step compiles nothing."""
    import cadence.worker.input_batch as input_batch
    import cadence.worker.step_buffers as step_buffers

    seen: dict[str, list[tuple]] = {"layout_step": [], "stage_step": []}

    def recording(module, name):
        fn = getattr(module, name)

        def call(*args):
            seen[name].append(tuple(fn.typeof_pyval(a) for a in args))
            return fn(*args)

        monkeypatch.setattr(module, name, call)

    recording(input_batch, "layout_step")
    recording(step_buffers, "stage_step")
    rt = get_device("cpu")
    batch = InputBatch(8, 64, 4, 16)
    buf = StepBuffers(rt, rt.create_stream(), 64, 8, 4, torch.device("cpu"))
    batch.warm_up()
    buf.warm_up()
    new = [NewRequestData("a", list(range(1, 11)), [], SamplingParams(), [3], 0),
           NewRequestData("b", list(range(1, 31)), [], SamplingParams(), [4, 5], 0)]
    so = SchedulerOutput(new, CachedRequestData(), {"a": 10, "b": 7}, 17)
    batch.apply(so)
    inp = batch.prepare(so)
    buf.upload(inp, padded_tokens=32, padded_rows=8)
    buf.upload(inp)
    for name, calls in seen.items():
        warm, *steps = calls
        assert steps and all(step == warm for step in steps), name


def test_token_arrays_are_aligned_rows_of_one_block_for_any_buffer_size():
    """input_ids, positions and slot_mapping upload as one 2D copy: rows of one block, each
    starting 128 bytes apart from the others whatever max_num_tokens is (kernels specialize on
    alignment), each exactly max_num_tokens long; an odd size uploads the same values."""
    rt = get_device("cpu")
    batch = InputBatch(8, 64, 4, 16)
    new = [NewRequestData("a", list(range(1, 11)), [], SamplingParams(), [3], 0)]
    so = SchedulerOutput(new, CachedRequestData(), {"a": 10}, 10)
    batch.apply(so)
    inp = batch.prepare(so)
    for max_tokens in (37, 64):
        buf = StepBuffers(rt, rt.create_stream(), max_tokens, 8, 4, torch.device("cpu"))
        rows = (buf.input_ids, buf.positions, buf.slot_mapping)
        assert all(r.shape == (max_tokens,) and r.is_contiguous() for r in rows)
        starts = [r.data_ptr() for r in rows]
        assert all((s - starts[0]) % 128 == 0 and s - starts[0] >= 8 * max_tokens * i
                   for i, s in enumerate(starts))
        buf.upload(inp, padded_tokens=16, padded_rows=1)
        np.testing.assert_array_equal(buf.input_ids[:10].numpy(), range(1, 11))
        np.testing.assert_array_equal(buf.positions[:10].numpy(), range(10))
        np.testing.assert_array_equal(buf.slot_mapping[:10].numpy(), range(48, 58))
        assert (buf.slot_mapping[10:16] == -1).all()
