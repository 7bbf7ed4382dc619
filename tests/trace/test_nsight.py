"""``cadence trace`` with Nsight Systems: the commands, a missing ``nsys``, and a report read
from an SQLite export."""

from __future__ import annotations

import json
import shutil

import pytest

from cadence.cli import main as cadence_main
from nsys.gaps import summarize
from tests.nsys.test_gaps import _nsys_db


def test_dry_run_prints_the_nsys_commands(capsys) -> None:
    argv = ["trace", "--profiler", "nsys", "--dry-run", "--device", "cuda", "--batch-size", "64",
            "--out", "/tmp/run/b64.html"]
    assert cadence_main(argv) == 0
    profile, export = capsys.readouterr().out.splitlines()
    assert profile.startswith(
        "CADENCE_NVTX=1 nsys profile -t cuda,nvtx,osrt --cuda-graph-trace=node "
        "--capture-range=cudaProfilerApi "
        "--capture-range-end=stop -o /tmp/run/b64 -f true ")
    # The child is this command, bracketing its steps for nsys and describing its run.
    assert profile.endswith(
        "-m cadence trace --profiler nsys --device cuda --batch-size 64 --out /tmp/run/b64.html "
        "--profiler cuda-api --run-info-out /tmp/run/b64.run.json")
    assert export == "nsys export -q -t sqlite -f true -o /tmp/run/b64.sqlite /tmp/run/b64.nsys-rep"


def test_missing_nsys_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("nsys") is None
    with pytest.raises(SystemExit) as exc:
        cadence_main(["trace", "--profiler", "nsys", "--out", str(tmp_path / "r.html")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("cadence trace: error: Nsight Systems ('nsys') is not on PATH")
    assert not (tmp_path / "r.html").exists()


def test_cuda_api_needs_cuda(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cadence_main(["trace", "--model", "tiny", "--device", "cpu", "--profiler", "cuda-api",
                      "--steps", "1", "--warmup-steps", "0", "--input-len", "4"])
    assert exc.value.code == 2 and "need --device cuda" in capsys.readouterr().err


def test_report_from_an_sqlite_export(tmp_path) -> None:
    db = tmp_path / "run.sqlite"
    _nsys_db(db)  # the synthetic trace of tests/nsys/test_gaps.py, in nanoseconds
    out = tmp_path / "run.html"
    assert cadence_main(["trace", "--from-trace", str(db), "--out", str(out),
                         "--json-out", str(tmp_path / "run.json")]) == 0
    figures = json.loads((tmp_path / "run.json").read_text())
    assert figures["summary"] == json.loads(json.dumps(summarize(db)))
    assert figures["summary"]["gaps_us"] == [10, 35]
    # Kernels, all named "kern": c1 45 + c2 45 | c4 35 + c77 6 + c5 30 | c7 30 + c8 18, seven
    # calls over three steps; memcpys: c3 10 + c6 5.
    rows = {r["name"]: r for r in figures["kernels"]}
    assert set(rows) == {"kern", "gpu_memcpy"}
    assert rows["kern"]["calls_per_step"] == pytest.approx(7 / 3)
    assert rows["kern"]["us_per_step"] == pytest.approx((45 + 45 + 35 + 6 + 30 + 30 + 18) / 3)
    assert rows["gpu_memcpy"]["us_per_call"] == pytest.approx(7.5)
    busy = (90 + 76 + 48) / 3
    assert figures["reference_us_per_step"] == pytest.approx(busy)
    assert rows["gpu_memcpy"]["share"] == pytest.approx(5 / busy)
    page = out.read_text()
    assert page.count("data:image/png;base64,") == 2 and 'id="kernels"' in page


def test_help_and_mistakes(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cadence_main(["trace", "--help"])
    assert exc.value.code == 0 and "--load {decode,prefill,mixed}" in capsys.readouterr().out
    for bad, message in ((["--steps", "0"], "steps must be >= 1"),
                         (["--from-trace", str(tmp_path / "none.json")], "none.json"),
                         (["--max-rows", "0"], "--max-rows must be at least 1")):
        with pytest.raises(SystemExit) as exc:
            cadence_main(["trace", "--model", "tiny", "--device", "cpu", *bad,
                          "--out", str(tmp_path / "r.html")])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("cadence trace: error: ") and message in err
        assert len(err.strip().splitlines()) == 1
