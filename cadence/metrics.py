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
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from cadence.core_types import SchedulerStats

__all__ = ["CONTENT_TYPE_LATEST", "PrometheusStatLogger", "StatLogger"]

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0]
TTFT_BUCKETS += [7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5]
ITL_BUCKETS += [0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
E2E_BUCKETS += [120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


@dataclass
class FinishedRequestStats:
    request_id: str
    finish_reason: str
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int


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


class StatLogger(Protocol):
    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None: ...


class PrometheusStatLogger:
    """Prometheus metrics of one served model, in a registry of its own.

    ``multiprocess``: one of several API server processes (values in the shared multiprocess
    files); ``engine_stats``: this logger records the engine-wide gauges and counters."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None, *,
                 multiprocess: bool = False, engine_stats: bool = True) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.multiprocess = multiprocess
        self.engine_stats = engine_stats
        labels = ["model_name"]
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            if multiprocess:  # one writer (front end 0): its latest value
                return Gauge(name, doc, labels, registry=r, multiprocess_mode="mostrecent")
            return Gauge(name, doc, labels, registry=r)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels + list(extra), registry=r)

        def histogram(name: str, doc: str, buckets: list[float]
                      ) -> BatchHistogram | _SharedHistogram:
            kind = _SharedHistogram if multiprocess else BatchHistogram
            return kind(name, doc, buckets, {"model_name": model_name}, r)

        m = model_name
        self.num_requests_running = gauge(
            "cadence:num_requests_running", "Number of requests in model execution batches."
        ).labels(m)
        self.num_requests_waiting = gauge(
            "cadence:num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(m)
        self.kv_cache_usage = gauge(
            "cadence:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(m)
        self.num_preemptions = counter(
            "cadence:num_preemptions", "Cumulative number of preemptions from the engine."
        ).labels(m)
        self.prefix_cache_queries = counter(
            "cadence:prefix_cache_queries", "Prefix-cache queries, in terms of number of tokens."
        ).labels(m)
        self.prefix_cache_hits = counter(
            "cadence:prefix_cache_hits", "Prefix-cache hits, in terms of number of tokens."
        ).labels(m)
        self.prompt_tokens = counter(
            "cadence:prompt_tokens", "Number of prefill tokens processed."
        ).labels(m)
        self.generation_tokens = counter(
            "cadence:generation_tokens", "Number of generation tokens processed."
        ).labels(m)
        self._request_success = counter(
            "cadence:request_success", "Count of finished requests.", ("finished_reason",)
        )
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
        self._model_name = model_name
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
            it = iteration_stats
            if it.num_prompt_tokens:
                self.prompt_tokens.inc(it.num_prompt_tokens)
            if it.num_generation_tokens:
                self.generation_tokens.inc(it.num_generation_tokens)
            if it.time_to_first_tokens:
                self.time_to_first_token.observe_many(it.time_to_first_tokens)
            if it.inter_token_latencies:
                self.inter_token_latency.observe_many(it.inter_token_latencies)
            for fin in it.finished_requests:
                self.e2e_request_latency.observe(fin.e2e_latency)
                self._request_success.labels(self._model_name, fin.finish_reason).inc()

    def exposition(self) -> bytes:
        """The registry in Prometheus text format (every API server process's, summed)."""
        if self.multiprocess:
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
