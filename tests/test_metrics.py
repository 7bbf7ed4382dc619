"""PrometheusStatLogger: vLLM-style metric names, exact counts, one registry per logger."""

from __future__ import annotations

from cadence.core_types import SchedulerStats
from cadence.metrics import FinishedRequestStats, IterationStats, PrometheusStatLogger


def sample(logger: PrometheusStatLogger, name: str, labels: dict[str, str] | None = None) -> float:
    value = logger.registry.get_sample_value(name, {"model_name": "m", **(labels or {})})
    assert value is not None, name
    return value


def test_scheduler_gauges_and_cumulative_counters() -> None:
    logger = PrometheusStatLogger("m")
    logger.record(SchedulerStats(3, 2, 0.25, prefix_cache_queries=10, prefix_cache_hits=4), None)
    assert sample(logger, "cadence:num_requests_running") == 3
    assert sample(logger, "cadence:num_requests_waiting") == 2
    assert sample(logger, "cadence:kv_cache_usage_perc") == 0.25
    # Totals arrive cumulative (also repeated by a scrape); counters add only the increase.
    logger.record(SchedulerStats(1, 0, 0.1, prefix_cache_queries=10, prefix_cache_hits=4), None)
    logger.record(
        SchedulerStats(0, 0, 0.0, prefix_cache_queries=16, prefix_cache_hits=9, num_preemptions=2),
        None,
    )
    assert sample(logger, "cadence:prefix_cache_queries_total") == 16
    assert sample(logger, "cadence:prefix_cache_hits_total") == 9
    assert sample(logger, "cadence:num_preemptions_total") == 2
    assert sample(logger, "cadence:num_requests_running") == 0


def test_iteration_stats_feed_counters_and_histograms() -> None:
    logger = PrometheusStatLogger("m")
    it = IterationStats(
        num_prompt_tokens=12,
        num_generation_tokens=5,
        time_to_first_tokens=[0.02, 0.3],
        inter_token_latencies=[0.004, 0.006, 0.2],
        finished_requests=[FinishedRequestStats("a", "stop", 1.2, 6, 3)],
    )
    logger.record(None, it)
    logger.record(None, IterationStats(num_generation_tokens=2))
    assert sample(logger, "cadence:prompt_tokens_total") == 12
    assert sample(logger, "cadence:generation_tokens_total") == 7
    assert sample(logger, "cadence:time_to_first_token_seconds_count") == 2
    assert sample(logger, "cadence:time_to_first_token_seconds_sum") == 0.32
    assert sample(logger, "cadence:inter_token_latency_seconds_bucket", {"le": "0.005"}) == 1
    assert sample(logger, "cadence:inter_token_latency_seconds_count") == 3
    assert sample(logger, "cadence:e2e_request_latency_seconds_count") == 1
    assert sample(logger, "cadence:request_success_total", {"finished_reason": "stop"}) == 1
    text = logger.exposition().decode()
    for name in (
        "cadence:num_requests_running",
        "cadence:num_requests_waiting",
        "cadence:kv_cache_usage_perc",
        "cadence:prompt_tokens_total",
        "cadence:generation_tokens_total",
        "cadence:time_to_first_token_seconds_bucket",
        "cadence:inter_token_latency_seconds_bucket",
        "cadence:e2e_request_latency_seconds_bucket",
    ):
        assert name + "{" in text


def test_loggers_do_not_share_state() -> None:
    a, b = PrometheusStatLogger("m"), PrometheusStatLogger("m")
    a.record(None, IterationStats(num_generation_tokens=4))
    assert sample(a, "cadence:generation_tokens_total") == 4
    assert sample(b, "cadence:generation_tokens_total") == 0
