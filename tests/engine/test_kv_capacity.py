"""A request that does not fit the free KV blocks waits (no preemption: waiting requests never
preempt running ones) until a running one finishes, then runs to the end with the tokens it
gets alone."""

from __future__ import annotations

import pytest

from cadence.core_types import EngineCoreRequest
from cadence.engine.core import EngineCore
from cadence.sampling_params import SamplingParams
from tests.tiny import tiny_args

PROMPT_A = list(range(10, 50))
PROMPT_B = list(range(60, 100))


def run_alone(core: EngineCore, rid: str, prompt: list[int], params: SamplingParams) -> list[int]:
    core.add_request(EngineCoreRequest(rid, prompt, params))
    tokens: list[int] = []
    while core.has_work():
        outs, _ = core.step_fn()
        tokens += [t for o in outs.outputs for t in o.new_token_ids]
    return tokens


def test_a_request_waits_for_free_blocks_then_finishes() -> None:
    # 6 blocks of 16 slots, block 0 being the null block: 5 usable, 80 slots. Each request is
    # 40 + 30 = 70 tokens (5 blocks at its end, 3 for its prompt): alone it fits, but while A
    # holds 3 blocks or more, B's prompt (3 blocks) does not.
    core = EngineCore(tiny_args(max_model_len=128, num_gpu_blocks_override=6,
                                enable_prefix_caching=False))
    assert (core.num_kv_blocks, core.block_size, core.num_free_kv_blocks) == (6, 16, 5)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    core.add_request(EngineCoreRequest("a", PROMPT_A, params))
    core.add_request(EngineCoreRequest("b", PROMPT_B, params))
    tokens: dict[str, list[int]] = {"a": [], "b": []}
    first_step: dict[str, int] = {}
    step = 0
    while core.has_work():
        outs, _ = core.step_fn()
        step += 1
        stats = core.make_stats()
        if step <= 30:  # A's prefill and 29 decodes: B waits all along
            assert (stats.num_running_reqs, stats.num_waiting_reqs) == (int(step < 30), 1)
        for o in outs.outputs:
            first_step.setdefault(o.request_id, step)
            tokens[o.request_id] += o.new_token_ids
    # B starts in the step after A's last one, in the blocks A gave back.
    assert first_step == {"a": 1, "b": 31}
    assert step >= 60 and core.make_stats().num_preemptions == 0
    assert core.num_free_kv_blocks == 5
    assert tokens["a"] == run_alone(core, "a2", PROMPT_A, params)
    assert tokens["b"] == run_alone(core, "b2", PROMPT_B, params)
    assert len(tokens["b"]) == 30
    core.shutdown()


@pytest.mark.parametrize(("blocks", "warned"), [(8, True), (33, False)])
def test_a_cache_smaller_than_the_context_is_said_at_start(caplog, blocks: int,
                                                           warned: bool) -> None:
    """With 16-token blocks and max_model_len 512, 32 usable blocks (block 0 is the null block)
    hold the context: fewer is warned of at start, naming both figures."""
    with caplog.at_level("WARNING", logger="cadence.engine.core"):
        core = EngineCore(tiny_args(max_model_len=512, block_size=16,
                                    num_gpu_blocks_override=blocks))
        core.shutdown()
    said = [r.getMessage() for r in caplog.records if "fewer than max_model_len" in r.getMessage()]
    assert bool(said) == warned
    if warned:
        assert said == [f"The KV cache holds {(blocks - 1) * 16} tokens, fewer than "
                        "max_model_len=512: a request needing more is refused. Lower "
                        "max_model_len, or give the cache more memory (gpu_memory_utilization, "
                        "num_gpu_blocks_override)."]


def _tiny_context() -> int:
    """The tiny checkpoint's own context, read from its config (no RoPE scaling in it)."""
    from transformers import AutoConfig

    from cadence.model.tiny import ensure_tiny_model

    config = AutoConfig.from_pretrained(ensure_tiny_model())
    assert (getattr(config, "rope_scaling", None) or {}).get("rope_type", "default") == "default"
    return int(config.max_position_embeddings)


@pytest.mark.parametrize("blocks", [9, 40, None])
def test_max_model_len_auto_fits_the_kv_cache(caplog, blocks: int | None) -> None:
    """max_model_len -1 (vLLM's "auto"): the model's context where one request of it fits the
    cache, else the tokens the cache holds ((blocks - 1) * 16: block 0 is the null block),
    said at start; the front end then bounds prompts by it."""
    from cadence.engine.llm import LLM

    context = _tiny_context()
    blocks = blocks or context // 16 + 1  # exactly the context: kept
    expected = min(context, (blocks - 1) * 16)
    with caplog.at_level("WARNING", logger="cadence.engine.core"):
        llm = LLM(model="tiny", max_model_len=-1, block_size=16, num_gpu_blocks_override=blocks,
                  async_scheduling=False)
    try:
        core = llm.llm_engine.engine_core
        assert core.max_model_len == core.config.scheduler.max_model_len == expected
        assert core.config.model.max_model_len == expected
        said = [r.getMessage() for r in caplog.records if "Auto-fit" in r.getMessage()]
        if expected < context:
            assert said == [f"Auto-fit max_model_len: reduced from {context} to {expected}, the "
                            f"tokens the KV cache holds ({blocks - 1} blocks of 16)."]
        else:
            assert said == []
        assert not any("fewer than max_model_len" in r.getMessage() for r in caplog.records)
        # A prompt of the whole context has no room for a token; one less runs to the end.
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        with pytest.raises(ValueError, match=f"maximum context length is {expected} tokens"):
            llm.generate({"prompt_token_ids": [7] * expected}, params, use_tqdm=False)
        if expected < context:
            out = llm.generate({"prompt_token_ids": [7] * (expected - 1)}, params,
                               use_tqdm=False)
            assert len(out[0].outputs[0].token_ids) == 1
            assert core.num_free_kv_blocks == blocks - 1
    finally:
        llm.shutdown()
