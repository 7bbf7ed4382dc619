from __future__ import annotations

import json

from nsys.gaps import summarize
from nsys.torch_trace import main, run

TINY = ["--model", "tiny", "--device", "cpu", "--batch-size", "2", "--input-len", "8"]


def test_cpu_trace_end_to_end(tmp_path) -> None:
    out = tmp_path / "trace.json"
    summary = run([*TINY, "--steps", "3", "--warmup-steps", "2", "--out", str(out)])
    assert summary["load"]["async_scheduling"] is True
    assert summary["load"]["output_len"] == 2 + 3 + 1

    events = json.loads(out.read_text())["traceEvents"]
    assert sum(e.get("name") == "engine_step" for e in events) == 3

    s = summarize(out)
    assert s["num_steps"] == 3 and not s["has_gpu"]
    assert s["host_us"]["min"] > 0
    assert all(st["host_us"] > 0 and st["kernels"] == 0 for st in s["steps"])
    assert s["gap_us"] is None
    # Every measured step is a full decode step: one token per request.
    assert summary["run"]["steps"] == 3 and summary["run"]["tokens"] == 3 * 2


def test_sync_scheduling_without_profiler(tmp_path, capsys) -> None:
    out = tmp_path / "unused.json"
    argv = [
        *TINY,
        "--no-async-scheduling",
        "--steps",
        "2",
        "--warmup-steps",
        "1",
        "--profiler",
        "none",
        "--out",
        str(out),
        "--json",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["load"]["async_scheduling"] is False
    assert summary["load"]["trace"] is None and not out.exists()
    assert summary["run"]["tokens"] == 2 * 2 and summary["run"]["ms_per_step"] > 0


def test_bad_flags_are_one_line_errors(tmp_path, capsys) -> None:
    import pytest

    out = str(tmp_path / "t.json")
    cases = [
        (["--batch-size", "0"], "--batch-size"),
        (["--warmup-steps", "-1"], "--warmup-steps"),
        (["--output-len", "0"], "--output-len"),
        (["--model", "no-such-model"], "no-such-model"),
        (["--temperature", "-1"], "temperature"),
        (["--input-len", "100000"], "max_position_embeddings"),
        (["--out", str(tmp_path)], "is a directory"),
        (["--summary-out", str(tmp_path / "none" / "s.json")], "--summary-out"),
    ]
    for extra, named in cases:
        with pytest.raises(SystemExit) as exc:
            main([*TINY, "--steps", "1", "--out", out, *extra])
        assert exc.value.code == 2, extra
        err = capsys.readouterr().err
        assert "Traceback" not in err and named in err, (extra, err)
        assert err.count("\n") == 1, err
    assert not (tmp_path / "t.json").exists()
