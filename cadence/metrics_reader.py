"""A snapshot of a Prometheus registry as plain values (vLLM's ``vllm.v1.metrics.reader``):
what ``LLM.get_metrics()`` returns.

Gauges and counters give one value per label set, histograms their buckets (by the ``le`` upper
bound, ``+Inf`` included), count and sum. Other collector types are skipped. The names are the
server's ``/metrics`` names (``cadence:`` where vLLM has ``vllm:``).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.samples import Sample

__all__ = ["Counter", "Gauge", "Histogram", "Metric", "Vector", "metrics_snapshot"]


@dataclass
class Metric:
    """One metric of one label set (a name may come with several)."""

    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int


@dataclass
class Vector(Metric):
    """vLLM's array of counters (its speculative decoding's); none is recorded here."""

    values: list[int]


@dataclass
class Gauge(Metric):
    value: float


@dataclass
class Histogram(Metric):
    """``buckets``: the cumulative count at or below each upper bound (its ``le`` label)."""

    count: int
    sum: float
    buckets: dict[str, int]


def metrics_snapshot(registry: CollectorRegistry, prefix: str = "cadence:") -> list[Metric]:
    """The registry's gauges, counters and histograms named ``prefix``..., as values now."""
    out: list[Metric] = []
    for family in registry.collect():
        if not family.name.startswith(prefix):
            continue
        if family.type == "gauge":
            out.extend(Gauge(family.name, s.labels, s.value)
                       for s in _samples(family.samples, family.name))
        elif family.type == "counter":
            out.extend(Counter(family.name, s.labels, int(s.value))
                       for s in _samples(family.samples, family.name + "_total"))
        elif family.type == "histogram":
            out.extend(_histograms(family.name, family.samples))
    return out


def _samples(samples: list[Sample], name: str) -> list[Sample]:
    return [s for s in samples if s.name == name]


def _key(labels: dict[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in labels.items() if k != "le")


def _histograms(name: str, samples: list[Sample]) -> list[Histogram]:
    """One ``Histogram`` per label set of a histogram family's samples."""
    buckets: dict[frozenset[tuple[str, str]], dict[str, int]] = {}
    for s in _samples(samples, name + "_bucket"):
        buckets.setdefault(_key(s.labels), {})[s.labels["le"]] = int(s.value)
    counts = {_key(s.labels): int(s.value) for s in _samples(samples, name + "_count")}
    sums = {_key(s.labels): s.value for s in _samples(samples, name + "_sum")}
    return [Histogram(name, dict(key), counts.get(key, 0), sums.get(key, 0.0), by_le)
            for key, by_le in buckets.items()]
