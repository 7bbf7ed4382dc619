"""LLM.get_metrics (vLLM's): the offline engine's statistics where disable_log_stats=False."""

from __future__ import annotations

import pytest

from cadence import LLM, SamplingParams
from cadence.metrics_reader import Counter, Gauge, Histogram

PROMPTS = ["Hello there", "Once upon a time", "x"]


def test_get_metrics_counts_what_generate_did() -> None:
    llm = LLM("tiny", max_model_len=128, num_gpu_blocks_override=32, disable_log_stats=False)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        prompt_tokens = sum(len(o.prompt_token_ids) for o in outs)
        metrics = {(m.name, tuple(sorted(m.labels.items()))): m for m in llm.get_metrics()}
        by_name: dict[str, list] = {}
        for (name, _), m in metrics.items():
            by_name.setdefault(name, []).append(m)

        def one(name: str, kind: type):
            [m] = by_name[name]
            assert isinstance(m, kind)
            return m

        assert one("cadence:generation_tokens", Counter).value == 5 * len(PROMPTS)
        assert one("cadence:prompt_tokens", Counter).value == prompt_tokens
        assert one("cadence:num_requests_running", Gauge).value == 0
        assert one("cadence:num_requests_waiting", Gauge).value == 0
        success = {m.labels["finished_reason"]: m.value for m in by_name["cadence:request_success"]}
        assert success["length"] == len(PROMPTS) and sum(success.values()) == len(PROMPTS)
        gen = one("cadence:request_generation_tokens", Histogram)
        assert (gen.count, gen.sum, gen.buckets["+Inf"]) == (len(PROMPTS), 15.0, len(PROMPTS))
        assert one("cadence:time_to_first_token_seconds", Histogram).count == len(PROMPTS)
        # A second generate adds to the counters.
        llm.generate(PROMPTS[:1], params, use_tqdm=False)
        [again] = [m for m in llm.get_metrics() if m.name == "cadence:generation_tokens"]
        assert again.value == 5 * (len(PROMPTS) + 1)
    finally:
        llm.shutdown()


def test_get_metrics_needs_statistics_on() -> None:
    llm = LLM("tiny", max_model_len=64, num_gpu_blocks_override=16)  # vLLM's default: off
    try:
        with pytest.raises(RuntimeError, match="disable_log_stats=False"):
            llm.get_metrics()
    finally:
        llm.shutdown()
