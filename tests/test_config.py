"""The engine configs validate their own values: the bounds vLLM documents, inclusive where it
says so."""

from __future__ import annotations

import pytest

from cadence.config import (
    CacheConfig,
    EngineConfig,
    GraphConfig,
    ModelConfig,
    SchedulerConfig,
    resolved_dtype,
)


def test_max_logprobs_minus_one_means_the_whole_vocabulary() -> None:
    assert ModelConfig(max_logprobs=-1).max_logprobs == -1
    assert ModelConfig(max_logprobs=0).max_logprobs == 0
    with pytest.raises(ValueError, match="max_logprobs"):
        ModelConfig(max_logprobs=-2)


@pytest.mark.parametrize("value", [1.0, 0.5, 1e-3])
def test_gpu_memory_utilization_accepts_the_half_open_interval(value: float) -> None:
    assert CacheConfig(gpu_memory_utilization=value).gpu_memory_utilization == value


@pytest.mark.parametrize("value", [0.0, -0.1, 1.01])
def test_gpu_memory_utilization_outside_zero_one_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        CacheConfig(gpu_memory_utilization=value)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"num_gpu_blocks_override": 0}, "num_gpu_blocks_override"),
    ({"num_gpu_blocks_override": 1}, "num_gpu_blocks_override"),  # block 0 is reserved
    ({"block_size": 0}, "block_size"),
    ({"cache_dtype": "fp8_e5m2"}, "cache_dtype"),
])
def test_cache_config_bounds(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        CacheConfig(**kwargs)  # type: ignore[arg-type]


def test_cache_config_smallest_valid_values() -> None:
    cfg = CacheConfig(block_size=1, num_gpu_blocks_override=2)
    assert (cfg.block_size, cfg.num_gpu_blocks_override) == (1, 2)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"max_model_len": 0}, "max_model_len"),
    ({"dtype": "int8"}, "dtype"),
    ({"load_format": "pt"}, "load_format"),
    ({"quantization": "awq"}, "quantization"),
])
def test_model_config_bounds(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        ModelConfig(**kwargs)  # type: ignore[arg-type]


def test_scheduler_budget_may_equal_max_model_len_without_chunking() -> None:
    # vLLM: without chunked prefill the budget must hold a whole max_model_len prompt.
    ok = SchedulerConfig(max_num_batched_tokens=2048, max_model_len=2048,
                         enable_chunked_prefill=False)
    assert ok.max_num_batched_tokens == ok.max_model_len
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_batched_tokens=2047, max_model_len=2048,
                        enable_chunked_prefill=False)
    assert SchedulerConfig(max_num_batched_tokens=16, max_model_len=2048).max_model_len == 2048


def test_auto_dtype_is_bfloat16_on_cuda_and_float32_on_the_cpu() -> None:
    assert resolved_dtype("auto", "cuda") == "bfloat16"
    assert resolved_dtype("auto", "cpu") == "float32"
    assert resolved_dtype("float16", "cpu") == "float16"
    assert EngineConfig(device="cpu").dtype == "float32"


def test_graphs_are_captured_on_cuda_or_when_emulated_unless_eager() -> None:
    assert EngineConfig(device="cuda").use_graphs
    assert not EngineConfig(device="cpu").use_graphs
    assert EngineConfig(device="cpu", graphs=GraphConfig(emulate=True)).use_graphs
    assert not EngineConfig(device="cuda", graphs=GraphConfig(enforce_eager=True)).use_graphs
    with pytest.raises(ValueError, match="device"):
        EngineConfig(device="mps")


def test_a_block_larger_than_any_cache_is_refused() -> None:
    """A --block-size past MAX_BLOCK_SIZE is a mistake: one error, before any allocation (a
    block of 10 million tokens once took the machine's memory on the CPU backend)."""
    from cadence.config import MAX_BLOCK_SIZE, CacheConfig

    assert CacheConfig(block_size=MAX_BLOCK_SIZE).block_size == MAX_BLOCK_SIZE
    for bad in (0, MAX_BLOCK_SIZE + 1, 10_000_000):
        with pytest.raises(ValueError, match=f"block_size must be 1 to {MAX_BLOCK_SIZE}"):
            CacheConfig(block_size=bad)


def test_scheduler_bounds_at_their_edges() -> None:
    """max_num_seqs 1 to 65536 inclusive (the message says so); stream_interval at least 1
    (vLLM's ge=1)."""
    top = SchedulerConfig(max_num_seqs=65536, max_num_batched_tokens=65536, max_model_len=2048)
    assert top.max_num_seqs == 65536
    with pytest.raises(ValueError, match="max_num_seqs must be 1 to 65536"):
        SchedulerConfig(max_num_seqs=65537, max_num_batched_tokens=65537, max_model_len=2048)
    with pytest.raises(ValueError, match="stream_interval must be at least 1"):
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=2048,
                        stream_interval=0)
