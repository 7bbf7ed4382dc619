from __future__ import annotations

import pytest
import torch

from cadence.model.attention import TorchAttentionBackend
from cadence.model.loader import build_model
from cadence.model.registry import resolve_model
from cadence.worker.kv_profile import largest_step_layout
from cadence.worker.model_runner import ModelRunner
from tests.tiny import tiny_args


@pytest.mark.parametrize(
    ("tokens", "seqs", "model_len", "expected"),
    [
        (8192, 1, 153, [153]),
        (8192, 32, 153, [153] * 32),
        (8192, 128, 400, [400] * 20 + [192]),
        (100, 4, 64, [64, 36]),
    ],
)
def test_largest_step_layout(tokens, seqs, model_len, expected):
    lens = largest_step_layout(tokens, seqs, model_len)
    assert lens == expected
    assert len(lens) <= seqs and max(lens) <= model_len and sum(lens) <= tokens


def _runner(**overrides: object) -> ModelRunner:
    """A CPU ModelRunner over the tiny model (4 layers, 2 KV heads of 32), not yet started."""
    args = tiny_args(**{"num_gpu_blocks_override": None, **overrides})
    spec = resolve_model(args.model, args.max_model_len)
    config = args.create_engine_config(spec.max_model_len)
    model = build_model(spec, torch.float32, "cpu", "auto", TorchAttentionBackend(), 0)
    return ModelRunner(config, spec, model, torch.float32, torch.device("cpu"))


# One block of the tiny model's float32 cache: k and v, 16 tokens, 2 heads of 32, 4 layers.
_TINY_BLOCK_BYTES = 2 * 16 * 2 * 32 * 4 * 4


def test_cpu_kv_cache_holds_every_sequence_at_full_length_plus_the_dummy_block() -> None:
    runner = _runner(max_model_len=100, max_num_seqs=4)
    assert runner.kv_block_bytes() == _TINY_BLOCK_BYTES
    # ceil(100 / 16) = 7 blocks per sequence, 4 sequences, and block 0 (the dummy block).
    assert runner.determine_num_kv_blocks() == 4 * 7 + 1
    runner.close()


def test_cpu_kv_cache_is_capped_at_one_gib() -> None:
    # 256 sequences of 2048 tokens would need 256 * 128 + 1 blocks: more than 1 GiB holds.
    runner = _runner(max_model_len=2048, max_num_seqs=256)
    assert runner.determine_num_kv_blocks() == (1 << 30) // _TINY_BLOCK_BYTES == 32768
    runner.close()


def test_forced_block_count_wins() -> None:
    runner = _runner(max_model_len=100, max_num_seqs=4, num_gpu_blocks_override=3)
    assert runner.determine_num_kv_blocks() == 3
    runner.close()


def test_mixed_graph_rows_are_as_many_requests_as_its_tokens_can_hold() -> None:
    runner = _runner(max_model_len=100, max_num_seqs=8)
    assert [runner.mixed_rows(t) for t in (1, 3, 8, 9, 64)] == [1, 3, 8, 8, 8]
    runner.close()


def test_a_budget_below_max_num_seqs_still_fits_a_full_decode_batch() -> None:
    """A decode step of max_num_seqs rows takes max_num_seqs tokens, whatever the budget: the
    token buffers and the (emulated) decode graphs are sized for it."""
    runner = _runner(max_model_len=64, max_num_seqs=8, max_num_batched_tokens=4,
                     emulate_graphs=True, max_capture_tokens=0)
    assert runner.max_num_tokens == 8
    assert runner.buffers.input_ids.numel() >= 8
    runner.initialize_kv_cache(runner.determine_num_kv_blocks())
    runner.capture_graphs()
    assert runner.graphs is not None and runner.graphs.bucket_for(8) == 8
    runner.close()


def test_mixed_graphs_never_exceed_the_step_buffers() -> None:
    """A config built without EngineArgs may ask for mixed graphs past the step budget: the
    runner captures none larger than its buffers (a step's upload would refuse them)."""
    from dataclasses import replace

    from cadence.config import GraphConfig

    runner = _runner(max_model_len=100, max_num_seqs=4, max_num_batched_tokens=64)
    runner.config = replace(runner.config, graphs=GraphConfig(max_capture_tokens=4096,
                                                              emulate=True))
    runner.initialize_kv_cache(runner.determine_num_kv_blocks())
    runner.capture_graphs()
    assert runner.max_num_tokens == 64 and runner.mixed_graphs.sizes[-1] == 64
    runner.close()
