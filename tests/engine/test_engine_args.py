"""EngineArgs resolved into the engine's configs: defaults that follow vLLM, values that must
reach the configs unchanged, and the bounds that clamp them."""

from __future__ import annotations

import pytest

from cadence.engine.engine_args import EngineArgs


@pytest.fixture(autouse=True)
def no_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CADENCE_ASYNC_SCHEDULING", raising=False)


def config(**kw: object):
    return EngineArgs(model="tiny", device="cpu", **kw).create_engine_config(2048)


def test_async_scheduling_is_on_by_default_and_overridable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # DESIGN: depth-2 async scheduling by default, two batches in flight.
    sched = config().scheduler
    assert sched.async_scheduling is True and sched.max_concurrent_batches == 2
    assert config(async_scheduling=False).scheduler.max_concurrent_batches == 1
    monkeypatch.setenv("CADENCE_ASYNC_SCHEDULING", "0")
    assert config().scheduler.async_scheduling is False
    assert config(async_scheduling=True).scheduler.async_scheduling is True  # the argument wins


def test_mixed_graph_capture_never_exceeds_the_step_budget() -> None:
    # A captured mixed step holds at most max_num_batched_tokens tokens: larger graphs would
    # never replay, so the capture bound is clamped to the budget.
    assert config(max_num_batched_tokens=1024).graphs.max_capture_tokens == 1024
    assert config(max_num_batched_tokens=1024,
                  max_capture_tokens=4096).graphs.max_capture_tokens == 1024
    assert config(max_num_batched_tokens=1024,
                  max_capture_tokens=512).graphs.max_capture_tokens == 512
    # 0: decode graphs only (documented), not an error; below 0 is.
    assert config(max_capture_tokens=0).graphs.max_capture_tokens == 0
    with pytest.raises(ValueError, match="max_capture_tokens"):
        config(max_capture_tokens=-1)
    # The default: min(8192, budget); the budget defaults to max(8192, max_model_len <= 16384).
    assert config().graphs.max_capture_tokens == 8192


@pytest.mark.parametrize("max_logprobs", [-1, 0, 5, 20])
def test_max_logprobs_reaches_the_model_config(max_logprobs: int) -> None:
    # -1 is vLLM's "the whole vocabulary": accepted and kept as -1.
    assert config(max_logprobs=max_logprobs).model.max_logprobs == max_logprobs


def test_cache_and_scheduler_values_reach_their_configs() -> None:
    cfg = config(block_size=32, num_gpu_blocks_override=77, gpu_memory_utilization=0.5,
                 enable_prefix_caching=False, max_num_seqs=3, scheduling_policy="priority",
                 enable_chunked_prefill=False, max_num_batched_tokens=4096, seed=11,
                 enforce_eager=True, emulate_graphs=True)
    assert (cfg.cache.block_size, cfg.cache.num_gpu_blocks_override,
            cfg.cache.gpu_memory_utilization, cfg.cache.enable_prefix_caching) == (
        32, 77, 0.5, False)
    assert (cfg.scheduler.max_num_seqs, cfg.scheduler.policy,
            cfg.scheduler.enable_chunked_prefill, cfg.scheduler.max_num_batched_tokens,
            cfg.scheduler.max_model_len) == (3, "priority", False, 4096, 2048)
    assert (cfg.model.seed, cfg.graphs.enforce_eager, cfg.graphs.emulate) == (11, True, True)
    assert cfg.use_graphs is False  # enforce_eager wins over emulation


def test_vllms_arguments_for_what_cadence_does_are_taken() -> None:
    # Code written for vLLM passes these (its test_collective_rpc.py passes
    # distributed_executor_backend, its examples task= and served_model_name=).
    from cadence import LLM

    llm = LLM("tiny", max_model_len=64, num_gpu_blocks_override=16, task="generate",
              pipeline_parallel_size=1, distributed_executor_backend="uni", enable_lora=False,
              enable_sleep_mode=False, served_model_name="my-model")
    try:
        assert len(llm.generate(["hi"], use_tqdm=False)) == 1
    finally:
        llm.shutdown()
    EngineArgs(distributed_executor_backend="mp", tensor_parallel_size=2, served_model_name=["a"])


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"task": "embed"}, "task='embed' is not supported"),
    ({"pipeline_parallel_size": 2}, "pipeline_parallel_size=2 is not supported"),
    ({"distributed_executor_backend": "ray"}, "distributed_executor_backend='ray'"),
    ({"distributed_executor_backend": "uni", "tensor_parallel_size": 2}, "needs"),
    ({"enable_lora": True}, "enable_lora=True is not supported"),
    ({"enable_sleep_mode": True}, "enable_sleep_mode=True is not supported"),
    ({"served_model_name": 3}, "served_model_name must be"),
    ({"served_model_name": ["a", 1]}, "served_model_name must be"),
])
def test_vllms_arguments_for_what_cadence_does_not_are_one_line_errors(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        EngineArgs(**kwargs)


def test_none_where_vllm_defaults_to_none_is_the_default() -> None:
    """vLLM declares these ``... | None = None`` ("choose for me"); code passing None on to
    the engine gets the defaults, and vLLM's empty reasoning parser is none."""
    plain = EngineArgs()
    args = EngineArgs(max_num_seqs=None, block_size=None, enable_prefix_caching=None,
                      enable_chunked_prefill=None, reasoning_parser="")
    assert (args.max_num_seqs, args.block_size, args.enable_prefix_caching,
            args.enable_chunked_prefill) == (plain.max_num_seqs, plain.block_size,
                                             plain.enable_prefix_caching,
                                             plain.enable_chunked_prefill)
    assert args.reasoning_parser is None
    with pytest.raises(ValueError, match="max_model_len"):  # other fields keep their checks
        EngineArgs(max_model_len="1024")


def test_limit_mm_per_prompt_takes_text_only() -> None:
    """vLLM's limit_mm_per_prompt: none or 0 of each modality is what a text-only engine
    does; a positive limit is a one-line refusal naming it."""
    for fine in (None, {}, {"image": 0, "video": 0},
                 {"image": {"count": 0, "width": 512, "height": 512}, "video": {}}):
        assert EngineArgs(limit_mm_per_prompt=fine).limit_mm_per_prompt == fine
    for bad in ({"image": 1}, {"image": {"count": 2}}, {"audio": "0"}, [0]):
        with pytest.raises(ValueError, match="limit_mm_per_prompt=.*multimodal inputs are not"):
            EngineArgs(limit_mm_per_prompt=bad)
