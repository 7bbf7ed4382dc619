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
    assert lines[0].startswith("schedule()+update_from_output(), 8 running decode requests")
    record = json.loads(lines[1])
    assert json.loads(out_file.read_text()) == record
    figures = record["figures"]
    assert record["bench"] == "scheduler"
    assert figures["steps"] == 24
    assert figures["async_scheduling"] is bool(extra)
    assert 0 < figures["median_ms"] <= figures["p90_ms"]
    assert len(figures["repeat_median_ms"]) == 2
