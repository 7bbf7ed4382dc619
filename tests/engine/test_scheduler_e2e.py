"""vLLM's tests/v1/core/test_scheduler_e2e.py on the built-in tiny model: same engine settings
(prefix caching, a 6-token budget, 3 sequences, 16-token blocks), same prompts, same expected
outcomes, long_prefill_token_threshold=2 included."""

from __future__ import annotations

import pytest

from cadence import LLM

PROMPT = "Hello my name is Robert and I"


@pytest.fixture(scope="module")
def model() -> LLM:
    return LLM(
        "tiny", enforce_eager=True, enable_prefix_caching=True, max_num_batched_tokens=6,
        max_num_seqs=3, block_size=16, max_model_len=256, num_gpu_blocks_override=64,
        async_scheduling=False, long_prefill_token_threshold=2,
    )


def test_concurrent_partial_prefill(model: LLM) -> None:
    outputs = model.generate([PROMPT] * 3, use_tqdm=False)
    assert len(outputs) == 3
    for output in outputs:
        assert len(output.outputs) == 1


def test_prefix_cache_stats_is_recorded(model: LLM) -> None:
    # 17 tokens make sure the first 16 are cached in a block.
    input_tokens = {"prompt_token_ids": [101] * 17}
    model.generate([input_tokens], use_tqdm=False)
    outputs = model.generate([input_tokens], use_tqdm=False)
    assert outputs[0].num_cached_tokens == 16
