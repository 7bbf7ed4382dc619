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
