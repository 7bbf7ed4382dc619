"""Serving statistics: per-iteration front-end stats and their Prometheus exposition.

Names follow vLLM's metrics under a ``cadence:`` prefix. Every logger owns its own
``CollectorRegistry`` (never the process-global default), so several servers or tests can live
in one process.

With several API server processes (``--api-server-count``) the values live in
prometheus_client's multiprocess files (``PROMETHEUS_MULTIPROC_DIR``, set by the launcher) and
every scrape sums the processes: each request is counted by the one front end that served it;
the engine-wide gauges and cumulative counters (running, waiting, KV usage, preemptions, prefix
cache) are recorded by front end 0 alone, which hears of every engine step.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder

from cadence.core_types import FinishReason, SchedulerStats

__all__ = ["CONTENT_TYPE_LATEST", "PrometheusStatLogger", "StatLogger", "cache_config_info"]

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0]
TTFT_BUCKETS += [7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5]
ITL_BUCKETS += [0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
E2E_BUCKETS += [120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0]
TPOT_BUCKETS += [7.5, 10.0, 20.0, 40.0, 80.0]
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
N_BUCKETS = [1, 2, 5, 10, 20]


def buckets_1_2_5(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit`` (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return out
            out.append(m * scale)
        scale *= 10


@dataclass
class FinishedRequestStats:
    request_id: str
    finish_reason: str
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int
    # Phases (seconds); None where the request never got that far.
    queued_time: float | None = None  # waiting for its first scheduling
    prefill_time: float | None = None  # first scheduled -> first token
    decode_time: float | None = None  # first token -> last token
    inference_time: float | None = None  # first scheduled -> last token
    mean_time_per_output_token: float | None = None
    max_tokens_param: int | None = None
    # Observed once per request as the client sent it (vLLM): on the last choice to finish of
    # an n > 1 request (None on the others), n and the most tokens any of its choices made.
    n_param: int | None = 1
    max_num_generation_tokens: int | None = None


@dataclass
class IterationStats:
    """What one ``process_outputs`` call observed, for metrics (seconds, monotonic clock)."""

    num_prompt_tokens: int = 0  # prompts of requests that got their first token now
    num_generation_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)


class BatchHistogram:
    """A Prometheus histogram of one label set that takes many observations per call.

    prometheus_client's ``Histogram.observe`` takes a lock and walks the buckets in Python for
    every value; every generated token of every stream records an inter-token latency, so here a
    step's values go in with one lock and a C bisection each.
    """

    def __init__(
        self,
        name: str,
        doc: str,
        buckets: list[float],
        labels: dict[str, str],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.doc = doc
        self.bounds = sorted(buckets)
        self._labels = labels
        self._counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, value: float) -> None:
        self.observe_many((value,))

    def observe_many(self, values: Iterable[float]) -> None:
        bounds, counts = self.bounds, self._counts
        with self._lock:
            for v in values:
                counts[bisect_left(bounds, v)] += 1
                self._sum += v

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        family = HistogramMetricFamily(self.name, self.doc, labels=list(self._labels))
        cumulative, buckets = 0, []
        for bound, n in zip([*map(float, self.bounds), float("inf")], counts, strict=True):
            cumulative += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        family.add_metric(list(self._labels.values()), buckets, total)
        yield family

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.doc, labels=list(self._labels))]


class _SharedHistogram:
    """A histogram in prometheus_client's multiprocess files (one observation at a time)."""

    def __init__(self, name: str, doc: str, buckets: list[float], labels: dict[str, str],
                 registry: CollectorRegistry) -> None:
        self._child = Histogram(name, doc, list(labels), buckets=buckets,
                                registry=registry).labels(*labels.values())

    def observe(self, value: float) -> None:
        self._child.observe(value)

    def observe_many(self, values: Iterable[float]) -> None:
        for v in values:
            self._child.observe(v)


def cache_config_info(args: Any, block_size: int, num_gpu_blocks: int) -> dict[str, str]:
    """vLLM's ``cache_config_info`` labels of an engine made from ``args`` (its EngineArgs)."""
    return {"block_size": str(block_size), "num_gpu_blocks": str(num_gpu_blocks),
            "enable_prefix_caching": str(args.enable_prefix_caching),
            "gpu_memory_utilization": str(args.gpu_memory_utilization),
            "cache_dtype": args.kv_cache_dtype}


class StatLogger(Protocol):
    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None: ...


class PrometheusStatLogger:
    """Prometheus metrics of one served model, in a registry of its own.

    ``multiprocess``: one of several API server processes (values in the shared multiprocess
    files); ``engine_stats``: this logger records the engine-wide gauges and counters."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None, *,
                 multiprocess: bool = False, engine_stats: bool = True,
                 max_model_len: int = 4096, cache_info: dict[str, str] | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.multiprocess = multiprocess
        self.engine_stats = engine_stats
        # vLLM's labels: the served model, and the engine (one engine here, "0").
        label_values = {"model_name": model_name, "engine": "0"}
        labels = list(label_values)
        r = self.registry

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            if multiprocess:  # one writer (front end 0): its latest value
                return Gauge(name, doc, labels + list(extra), registry=r,
                             multiprocess_mode="mostrecent")
            return Gauge(name, doc, labels + list(extra), registry=r)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels + list(extra), registry=r)

        def histogram(name: str, doc: str, buckets: list[float] | list[int]
                      ) -> BatchHistogram | _SharedHistogram:
            kind = _SharedHistogram if multiprocess else BatchHistogram
            return kind(name, doc, [float(b) for b in buckets], label_values, r)

        lv = tuple(label_values.values())
        self.num_requests_running = gauge(
            "cadence:num_requests_running", "Number of requests in model execution batches."
        ).labels(*lv)
        self.num_requests_waiting = gauge(
            "cadence:num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(*lv)
        self.kv_cache_usage = gauge(
            "cadence:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(*lv)
        if multiprocess and engine_stats:
            # NOTE: a "mostrecent" gauge never set is left out of the scrape: shown at 0 from
            # the start, as one process's are.
            for idle in (self.num_requests_running, self.num_requests_waiting,
                         self.kv_cache_usage):
                idle.set(0)
        self.num_preemptions = counter(
            "cadence:num_preemptions", "Cumulative number of preemptions from the engine."
        ).labels(*lv)
        self.prefix_cache_queries = counter(
            "cadence:prefix_cache_queries", "Prefix-cache queries, in terms of number of tokens."
        ).labels(*lv)
        self.prefix_cache_hits = counter(
            "cadence:prefix_cache_hits", "Prefix-cache hits, in terms of number of tokens."
        ).labels(*lv)
        self.prompt_tokens = counter(
            "cadence:prompt_tokens", "Number of prefill tokens processed."
        ).labels(*lv)
        self.generation_tokens = counter(
            "cadence:generation_tokens", "Number of generation tokens processed."
        ).labels(*lv)
        self._request_success = counter(
            "cadence:request_success", "Count of successfully processed requests.",
            ("finished_reason",)
        )
        for reason in FinishReason:  # every series from the start, at 0 (vLLM's)
            self._request_success.labels(*lv, str(reason))
        self.time_to_first_token = histogram(
            "cadence:time_to_first_token_seconds", "Histogram of time to first token.", TTFT_BUCKETS
        )
        self.inter_token_latency = histogram(
            "cadence:inter_token_latency_seconds", "Histogram of inter-token latency.", ITL_BUCKETS
        )
        self.e2e_request_latency = histogram(
            "cadence:e2e_request_latency_seconds",
            "Histogram of end to end request latency.",
            E2E_BUCKETS,
        )
        tokens = buckets_1_2_5(max_model_len)
        self.iteration_tokens = histogram(
            "cadence:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS)
        self.request_prompt_tokens = histogram(
            "cadence:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.request_generation_tokens = histogram(
            "cadence:request_generation_tokens", "Number of generation tokens processed.", tokens)
        self.request_max_num_generation_tokens = histogram(
            "cadence:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.", tokens)
        self.request_params_n = histogram(
            "cadence:request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.request_params_max_tokens = histogram(
            "cadence:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
            tokens)
        self.request_time_per_output_token = histogram(
            "cadence:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.", TPOT_BUCKETS)
        self.request_queue_time = histogram(
            "cadence:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.", E2E_BUCKETS)
        self.request_inference_time = histogram(
            "cadence:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.", E2E_BUCKETS)
        self.request_prefill_time = histogram(
            "cadence:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.", E2E_BUCKETS)
        self.request_decode_time = histogram(
            "cadence:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.", E2E_BUCKETS)
        if cache_info is not None and engine_stats:
            info = dict(sorted(cache_info.items()))
            gauge("cadence:cache_config_info", "Information of the LLMEngine CacheConfig",
                  tuple(info)).labels(*lv, *info.values()).set(1)
        self._label_values = lv
        # Cumulative scheduler counters arrive as totals; counters only take increments.
        self._last_totals: tuple[int, int, int] = (0, 0, 0)

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        if scheduler_stats is not None and self.engine_stats:
            s = scheduler_stats
            self.num_requests_running.set(s.num_running_reqs)
            self.num_requests_waiting.set(s.num_waiting_reqs)
            self.kv_cache_usage.set(s.kv_cache_usage)
            totals = (s.num_preemptions, s.prefix_cache_queries, s.prefix_cache_hits)
            counters = (self.num_preemptions, self.prefix_cache_queries, self.prefix_cache_hits)
            last = self._last_totals
            for c, new, old in zip(counters, totals, last, strict=True):
                if new > old:
                    c.inc(new - old)
            self._last_totals = (
                max(totals[0], last[0]),
                max(totals[1], last[1]),
                max(totals[2], last[2]),
            )
        if iteration_stats is not None:
            self._record_iteration(iteration_stats)

    def _record_iteration(self, it: IterationStats) -> None:
        if it.num_prompt_tokens:
            self.prompt_tokens.inc(it.num_prompt_tokens)
        if it.num_generation_tokens:
            self.generation_tokens.inc(it.num_generation_tokens)
        if it.num_prompt_tokens or it.num_generation_tokens:
            self.iteration_tokens.observe(it.num_prompt_tokens + it.num_generation_tokens)
        if it.time_to_first_tokens:
            self.time_to_first_token.observe_many(it.time_to_first_tokens)
        if it.inter_token_latencies:
            self.inter_token_latency.observe_many(it.inter_token_latencies)
        for fin in it.finished_requests:
            self.e2e_request_latency.observe(fin.e2e_latency)
            self._request_success.labels(*self._label_values, fin.finish_reason).inc()
            self.request_prompt_tokens.observe(fin.num_prompt_tokens)
            self.request_generation_tokens.observe(fin.num_generation_tokens)
            if fin.n_param is not None:
                self.request_params_n.observe(fin.n_param)
            if fin.max_num_generation_tokens is not None:
                self.request_max_num_generation_tokens.observe(fin.max_num_generation_tokens)
            if fin.max_tokens_param is not None:
                self.request_params_max_tokens.observe(fin.max_tokens_param)
            phases = ((self.request_queue_time, fin.queued_time),
                      (self.request_prefill_time, fin.prefill_time),
                      (self.request_decode_time, fin.decode_time),
                      (self.request_inference_time, fin.inference_time),
                      (self.request_time_per_output_token, fin.mean_time_per_output_token))
            for hist, value in phases:
                if value is not None:
                    hist.observe(value)

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The registry (every API server process's, summed) and its content type: Prometheus
        text, or OpenMetrics where ``accept`` (the scrape's Accept header) asks for it."""
        encode, content_type = choose_encoder(accept or "")
        if self.multiprocess:
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return encode(registry), content_type
        return encode(self.registry), content_type
