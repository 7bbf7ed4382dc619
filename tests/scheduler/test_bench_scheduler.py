"""`cadence bench scheduler` runs end to end on a small workload and reports its figures."""

from __future__ import annotations

import json

import pytest

from cadence.bench import scheduler as bench


@pytest.mark.parametrize("extra", [[], ["--async-scheduling", "--policy", "priority"]])
def test_bench_scheduler_reports_median_and_p90(capsys, tmp_path, extra):
    out_file = tmp_path / "bench.jsonl"
    argv = ["--num-requests", "8", "--prompt-len", "20", "--steps", "12", "--warmup", "2"]
    argv += ["--repeats", "2", "--json", "--json-out", str(out_file), *extra]
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1  # --json: the record's line alone
    record = json.loads(lines[0])
    assert json.loads(out_file.read_text()) == record
    figures = record["figures"]
    assert record["bench"] == "scheduler"
    assert figures["steps"] == 24
    assert figures["async_scheduling"] is bool(extra)
    assert 0 < figures["median_ms"] <= figures["p90_ms"]
    assert len(figures["repeat_median_ms"]) == 2


def test_bench_scheduler_without_json_says_what_it_timed(capsys):
    assert bench.main(["--num-requests", "4", "--prompt-len", "8", "--steps", "4",
                       "--warmup", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("schedule()+update_from_output(), 4 running decode requests")


def test_bench_scheduler_with_a_long_prefill_reaches_steady_decode(capsys):
    """200 prompts of 3,000 tokens take 74 steps of 8,192 tokens to get in, longer than the
    timed steps and their margin: the first requests must still be decoding then."""
    assert bench.main(["--num-requests", "200", "--prompt-len", "3000", "--steps", "1",
                       "--warmup", "0", "--repeats", "1", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["figures"]["steps"] == 1


def _ns(*argv: str):
    return bench._parser().parse_args(list(argv))


def test_figures_pool_the_repeats(monkeypatch):
    """Median and p90 over every timed step of every repeat, the two halves' medians apart,
    and each repeat's own median; timings fixed here, so every figure is known."""
    runs = iter([([1.0, 2.0, 3.0, 4.0, 5.0], [0.5] * 5), ([10.0, 9.0, 8.0, 7.0, 6.0], [0.5] * 5)])
    monkeypatch.setattr(bench, "_run_once", lambda ns: next(runs))
    figures = bench.run(_ns("--repeats", "2"))
    # Totals 1.5 .. 10.5: the median between the 5th and 6th, p90 the 9th of ten (0.9 * 9).
    assert figures["steps"] == 10
    assert figures["median_ms"] == 6.0 and figures["p90_ms"] == 9.5
    assert figures["schedule_median_ms"] == 5.5 and figures["update_median_ms"] == 0.5
    assert figures["repeat_median_ms"] == [3.5, 8.5]


class _Clock:
    """A nanosecond clock that moves only when the scheduler works: schedule() takes 3 ms,
    update_from_output() 1 ms."""

    def __init__(self) -> None:
        self.ns = 0
        self.calls: list[str] = []

    def perf_counter_ns(self) -> int:
        return self.ns

    def wrap(self, scheduler):
        schedule, update = scheduler.schedule, scheduler.update_from_output

        def timed_schedule():
            self.calls.append("schedule")
            self.ns += 3_000_000
            return schedule()

        def timed_update(so, out):
            self.calls.append("update")
            self.ns += 1_000_000
            return update(so, out)

        scheduler.schedule, scheduler.update_from_output = timed_schedule, timed_update
        return scheduler


def _clocked(monkeypatch) -> _Clock:
    clock = _Clock()
    build = bench.build_scheduler
    monkeypatch.setattr(bench, "time", clock)
    monkeypatch.setattr(bench, "build_scheduler", lambda ns: clock.wrap(build(ns)))
    return clock


def test_timed_steps_are_steady_decode_after_the_warmup(monkeypatch):
    """4 prompts of 8 tokens prefill in one step; the 2 warm-up decode steps and then the 5
    timed ones follow: 8 schedule() calls, each timed one 3 ms plus its update's 1 ms."""
    clock = _clocked(monkeypatch)
    figures = bench.run(_ns("--num-requests", "4", "--prompt-len", "8", "--steps", "5",
                            "--warmup", "2", "--repeats", "1"))
    assert clock.calls.count("schedule") == 1 + 2 + 5
    assert clock.calls[:4] == ["schedule", "update"] * 2  # sync: one step in flight
    assert figures["steps"] == 5
    assert figures["schedule_median_ms"] == 3.0 and figures["update_median_ms"] == 1.0
    assert figures["median_ms"] == figures["p90_ms"] == 4.0


def test_async_scheduling_keeps_two_steps_in_flight(monkeypatch):
    clock = _clocked(monkeypatch)
    bench.run(_ns("--num-requests", "4", "--prompt-len", "8", "--steps", "3", "--warmup", "1",
                  "--repeats", "1", "--async-scheduling"))
    assert clock.calls[:4] == ["schedule", "schedule", "update", "schedule"]


@pytest.mark.parametrize("off", [False, True])
def test_gc_freeze_is_the_default_and_always_undone(monkeypatch, off):
    done: list[str] = []
    fake_gc = type("FakeGC", (), {name: staticmethod(lambda name=name: done.append(name))
                                  for name in ("collect", "freeze", "unfreeze")})
    monkeypatch.setattr(bench, "gc", fake_gc)
    argv = ["--num-requests", "2", "--prompt-len", "4", "--steps", "2", "--warmup", "0",
            "--repeats", "2"]
    figures = bench.run(_ns(*argv, *(["--no-gc-freeze"] if off else [])))
    assert done == (["collect", "unfreeze"] if off else ["collect", "freeze", "unfreeze"]) * 2
    assert figures["gc_freeze"] is not off


def test_the_scheduler_takes_the_options():
    ns = _ns("--num-requests", "3", "--prompt-len", "5", "--policy", "priority",
             "--no-prefix-caching", "--block-size", "8")
    scheduler = bench.build_scheduler(ns)
    assert scheduler.policy == "priority"
    assert scheduler.kv_cache_manager.enable_caching is False
    assert scheduler.cache_config.block_size == 8
    assert len(scheduler.requests) == 3
    assert bench.build_scheduler(_ns()).kv_cache_manager.enable_caching is True
