"""PrometheusStatLogger: vLLM-style metric names, exact counts, one registry per logger."""

from __future__ import annotations

from cadence.core_types import SchedulerStats
from cadence.metrics import FinishedRequestStats, IterationStats, PrometheusStatLogger


def sample(logger: PrometheusStatLogger, name: str, labels: dict[str, str] | None = None) -> float:
    all_labels = {"model_name": "m", "engine": "0", **(labels or {})}
    value = logger.registry.get_sample_value(name, all_labels)
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


def test_a_front_end_without_engine_stats_records_only_its_requests() -> None:
    """With several API servers, only front end 0 records the engine-wide gauges and counters
    (running, waiting, KV usage, prefix cache, preemptions) and the cache info: every other
    records its own requests' figures alone, so the sum over processes counts each once."""
    other = PrometheusStatLogger("m", engine_stats=False, cache_info={"block_size": "16"})
    other.record(SchedulerStats(3, 2, 0.25, prefix_cache_queries=10, prefix_cache_hits=4,
                                num_preemptions=1), IterationStats(num_generation_tokens=5))
    for name in ("cadence:num_requests_running", "cadence:num_requests_waiting",
                 "cadence:kv_cache_usage_perc", "cadence:prefix_cache_queries_total",
                 "cadence:prefix_cache_hits_total", "cadence:num_preemptions_total"):
        assert sample(other, name) == 0, name
    assert other.registry.get_sample_value(
        "cadence:cache_config_info", {"model_name": "m", "engine": "0", "block_size": "16"}
    ) is None
    assert sample(other, "cadence:generation_tokens_total") == 5  # its own requests' tokens
    first = PrometheusStatLogger("m", cache_info={"block_size": "16"})
    first.record(SchedulerStats(3, 2, 0.25, prefix_cache_queries=10), None)
    assert sample(first, "cadence:num_requests_running") == 3
    assert sample(first, "cadence:prefix_cache_queries_total") == 10
    assert sample(first, "cadence:cache_config_info", {"block_size": "16"}) == 1


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
    # Every finish reason's series is there from the start, at 0 (vLLM's).
    for reason in ("length", "abort", "error"):
        assert sample(logger, "cadence:request_success_total", {"finished_reason": reason}) == 0
    text = logger.exposition()[0].decode()
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


# vLLM v1's Prometheus metrics (vllm/v1/metrics/loggers.py), with their label names: a vLLM
# dashboard works against cadence by changing the prefix.
VLLM_METRICS = {
    "num_requests_running": "gauge", "num_requests_waiting": "gauge",
    "kv_cache_usage_perc": "gauge", "prefix_cache_queries": "counter",
    "prefix_cache_hits": "counter", "num_preemptions": "counter", "prompt_tokens": "counter",
    "generation_tokens": "counter", "request_success": "counter",
    "iteration_tokens_total": "histogram", "request_prompt_tokens": "histogram",
    "request_generation_tokens": "histogram", "request_max_num_generation_tokens": "histogram",
    "request_params_n": "histogram", "request_params_max_tokens": "histogram",
    "time_to_first_token_seconds": "histogram", "inter_token_latency_seconds": "histogram",
    "request_time_per_output_token_seconds": "histogram",
    "e2e_request_latency_seconds": "histogram", "request_queue_time_seconds": "histogram",
    "request_inference_time_seconds": "histogram", "request_prefill_time_seconds": "histogram",
    "request_decode_time_seconds": "histogram", "cache_config_info": "gauge",
}


def test_the_vllm_metric_set_with_its_labels() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    logger = PrometheusStatLogger("m", max_model_len=1000,
                                  cache_info={"block_size": "16", "num_gpu_blocks": "99"})
    it = IterationStats(num_prompt_tokens=7, num_generation_tokens=3)
    it.finished_requests.append(FinishedRequestStats(
        "r", "stop", 2.0, 7, 3, queued_time=0.25, prefill_time=0.5, decode_time=1.0,
        inference_time=1.5, mean_time_per_output_token=0.5, max_tokens_param=10, n_param=2,
        max_num_generation_tokens=3))
    logger.record(SchedulerStats(1, 0, 0.5), it)
    families = {f.name: f for f in text_string_to_metric_families(
        logger.exposition()[0].decode())}
    for name, kind in VLLM_METRICS.items():
        family = families.get(f"cadence:{name}")
        assert family is not None and family.type == kind, name
        assert all({"model_name", "engine"} <= set(s.labels) for s in family.samples), name
    # Each phase observed once, in its own bucket.
    for name, value in (("request_queue_time_seconds", 0.25),
                        ("request_prefill_time_seconds", 0.5),
                        ("request_decode_time_seconds", 1.0),
                        ("request_inference_time_seconds", 1.5),
                        ("request_params_n", 2.0), ("request_params_max_tokens", 10.0),
                        ("request_max_num_generation_tokens", 3.0),
                        ("iteration_tokens_total", 10.0)):
        assert sample(logger, f"cadence:{name}_sum") == value, name
        assert sample(logger, f"cadence:{name}_count") == 1, name
    info = logger.registry.get_sample_value(
        "cadence:cache_config_info",
        {"model_name": "m", "engine": "0", "block_size": "16", "num_gpu_blocks": "99"})
    assert info == 1


def test_token_count_buckets_follow_the_model_length() -> None:
    from cadence.metrics import buckets_1_2_5

    assert buckets_1_2_5(1000) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    assert buckets_1_2_5(4096) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]


def test_batch_histogram_buckets_are_less_or_equal() -> None:
    """Prometheus' le: a value equal to a bound is counted in that bound's bucket, as
    prometheus_client's own Histogram counts it."""
    from prometheus_client import CollectorRegistry, Histogram

    from cadence.metrics import BatchHistogram

    values = [0.1, 0.25, 0.5, 0.5000001, 1.0, 7.0]
    ours_registry, ref_registry = CollectorRegistry(), CollectorRegistry()
    ours = BatchHistogram("lat", "doc", [0.1, 0.5, 1.0], {"model_name": "m"}, ours_registry)
    ref = Histogram("lat", "doc", ["model_name"], buckets=[0.1, 0.5, 1.0],
                    registry=ref_registry).labels("m")
    ours.observe_many(values)
    for v in values:
        ref.observe(v)
    for le in ("0.1", "0.5", "1.0", "+Inf"):
        labels = {"model_name": "m", "le": le}
        assert ours_registry.get_sample_value("lat_bucket", labels) == \
            ref_registry.get_sample_value("lat_bucket", labels), le
    assert ours_registry.get_sample_value("lat_bucket", {"model_name": "m", "le": "0.5"}) == 3


def test_an_engine_step_without_tokens_is_no_iteration_observation() -> None:
    """iteration_tokens_total observes the steps that scheduled tokens: a record that only
    finished (aborted) requests is not a step of 0 tokens."""
    logger = PrometheusStatLogger("m")
    logger.record(None, IterationStats(finished_requests=[
        FinishedRequestStats("a", "abort", 0.1, 5, 0)]))
    assert sample(logger, "cadence:iteration_tokens_total_count") == 0
    assert sample(logger, "cadence:request_success_total", {"finished_reason": "abort"}) == 1
    logger.record(None, IterationStats(num_prompt_tokens=5, num_generation_tokens=2))
    assert sample(logger, "cadence:iteration_tokens_total_count") == 1
    assert sample(logger, "cadence:iteration_tokens_total_sum") == 7


def test_time_per_output_token_is_the_requests_mean_not_its_decode_time() -> None:
    logger = PrometheusStatLogger("m")
    logger.record(None, IterationStats(num_generation_tokens=1, finished_requests=[
        FinishedRequestStats("b", "stop", 2.0, 5, 5, decode_time=1.0,
                             mean_time_per_output_token=0.25)]))
    assert sample(logger, "cadence:request_time_per_output_token_seconds_count") == 1
    assert sample(logger, "cadence:request_time_per_output_token_seconds_sum") == 0.25
    # 0.25 s lands in the 0.3 bucket, not the 0.2 one (TPOT buckets 0.2, 0.3, ...).
    bucket = "cadence:request_time_per_output_token_seconds_bucket"
    assert sample(logger, bucket, {"le": "0.2"}) == 0
    assert sample(logger, bucket, {"le": "0.3"}) == 1
    assert sample(logger, "cadence:request_decode_time_seconds_sum") == 1.0


def test_inter_token_latency_has_vllms_itl_buckets() -> None:
    """vLLM's ITL bounds (0.001, 0.0025, 0.005, 0.01, 0.025, ...), not the TTFT ones."""
    logger = PrometheusStatLogger("m")
    logger.record(None, IterationStats(num_generation_tokens=2,
                                       inter_token_latencies=[0.002, 0.02]))
    bucket = "cadence:inter_token_latency_seconds_bucket"
    assert sample(logger, bucket, {"le": "0.001"}) == 0
    assert sample(logger, bucket, {"le": "0.0025"}) == 1
    assert sample(logger, bucket, {"le": "0.01"}) == 1
    assert sample(logger, bucket, {"le": "0.025"}) == 2
    assert sample(logger, bucket, {"le": "0.15"}) == 2
