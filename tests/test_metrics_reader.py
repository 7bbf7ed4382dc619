"""metrics_snapshot: a Prometheus registry as plain values (vLLM's metrics reader)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Summary
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge as PromGauge
from prometheus_client import Histogram as PromHistogram

from cadence.metrics_reader import Counter, Gauge, Histogram, metrics_snapshot


def test_gauges_counters_and_histograms_by_label_set() -> None:
    r = CollectorRegistry()
    PromGauge("cadence:g", "a gauge", ["model_name"], registry=r).labels("m").set(2.5)
    c = PromCounter("cadence:c", "a counter", ["reason"], registry=r)
    c.labels("stop").inc(3)
    c.labels("length").inc(1)
    h = PromHistogram("cadence:h", "a histogram", ["model_name"], buckets=[1.0, 10.0],
                      registry=r)
    for v in (0.5, 2.0, 2.0, 50.0):
        h.labels("m").observe(v)
    PromGauge("other:g", "not ours", registry=r).set(1)
    Summary("cadence:s", "a summary", registry=r).observe(1.0)  # a type the reader skips

    got = metrics_snapshot(r)
    assert Gauge("cadence:g", {"model_name": "m"}, 2.5) in got
    assert Counter("cadence:c", {"reason": "stop"}, 3) in got
    assert Counter("cadence:c", {"reason": "length"}, 1) in got
    [hist] = [m for m in got if isinstance(m, Histogram)]
    assert hist.labels == {"model_name": "m"}
    assert (hist.count, hist.sum) == (4, 54.5)
    assert hist.buckets == {"1.0": 1, "10.0": 3, "+Inf": 4}  # cumulative, vLLM's keys
    assert {m.name for m in got} == {"cadence:g", "cadence:c", "cadence:h"}
    assert [m.name for m in metrics_snapshot(r, prefix="other:")] == ["other:g"]
