"""Benchmark reports: a readable table by default, JSON on request, a roofline only where the
bandwidth is known, the commit of the running cadence."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from cadence.bench import latency, throughput
from cadence.bench.common import Record, git_commit
from cadence.bench.report import add_report_args, emit, fmt, read_bandwidth, table


def test_figures_are_rounded_for_people() -> None:
    assert [fmt(v) for v in (1234567.891, 12.345678, 0.000123456, 7, None, True)] == [
        "1,234,568", "12.35", "0.0001235", "7", "-", "yes"]


def test_table_aligns_columns_and_leaves_lists_out() -> None:
    out = table([{"batch": 1, "ms": 1.23456, "runs": [1, 2]}, {"batch": 64, "ms": 10.5}])
    lines = out.splitlines()
    assert lines[0].split() == ["batch", "ms"]
    assert [ln.split() for ln in lines[1:]] == [["1", "1.235"], ["64", "10.5"]]
    assert len({len(ln) for ln in lines}) == 1  # aligned


def test_roofline_bandwidth_only_where_known() -> None:
    assert read_bandwidth(None, "NVIDIA H200") == 4.11e12
    assert read_bandwidth(None, "cpu (x86_64)") is None
    assert read_bandwidth(2e12, "cpu (x86_64)") == 2e12
    # 'none' turns the roofline off, even on a device whose bandwidth is known.
    from cadence.bench.report import bandwidth_arg

    assert read_bandwidth(bandwidth_arg("none"), "NVIDIA H200") is None
    assert read_bandwidth(bandwidth_arg("None"), "cpu (x86_64)") is None
    assert bandwidth_arg("3.35e12") == 3.35e12
    with pytest.raises(argparse.ArgumentTypeError):
        bandwidth_arg("0")


def test_emit_prints_a_table_or_json_and_writes_json(tmp_path, capsys) -> None:
    p = argparse.ArgumentParser()
    add_report_args(p)
    rec = Record("x", "tiny", "cpu", "abc1234", "today", {"rows": [{"a": 1}]})
    out = tmp_path / "r.json"
    emit(rec, p.parse_args(["--json-out", str(out)]), [{"a": 1}])
    text = capsys.readouterr().out
    assert "{" not in text and "commit abc1234" in text
    assert json.loads(out.read_text())["figures"] == {"rows": [{"a": 1}]}
    emit(rec, p.parse_args(["--json"]), [{"a": 1}])
    assert json.loads(capsys.readouterr().out)["bench"] == "x"


def test_commit_of_a_checkout_or_an_installed_package(monkeypatch) -> None:
    import subprocess

    if (Path(__file__).resolve().parents[2] / ".git").exists():  # a checkout (CI's clone)
        commit = git_commit()
        assert commit != "unknown" and len(commit) >= 7

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    class Dist:
        def read_text(self, name: str) -> str:
            assert name == "direct_url.json"
            return json.dumps({"url": "https://x/y.git", "vcs_info": {"vcs": "git",
                                                                     "commit_id": "f00dfeed99"}})

    monkeypatch.setattr(subprocess, "run", no_git)
    monkeypatch.setattr("importlib.metadata.distribution", lambda name: Dist())
    assert git_commit() == "f00dfee"


TINY = ["--model", "tiny", "--max-model-len", "64", "--num-gpu-blocks-override", "64"]


def test_throughput_prints_a_table(capsys) -> None:
    assert throughput.main([*TINY, "--num-prompts", "3", "--input-len", "8",
                            "--output-len", "4", "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("throughput · tiny · cpu")
    assert "output_tokens_per_s" in out[1].split()
    assert not any(line.startswith("{") for line in out)


@pytest.mark.parametrize("bandwidth", [None, "1e11"])
def test_latency_roofline_only_with_a_bandwidth(capsys, bandwidth) -> None:
    extra = ["--bandwidth", bandwidth] if bandwidth else []
    assert latency.main([*TINY, "--batch-sizes", "1,2", "--input-len", "8", "--output-len",
                         "6", "--repeats", "1", "--json", *extra]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = rec["figures"]["results"]
    assert [r["batch"] for r in rows] == [1, 2]
    assert all(("roofline_ms" in r) == (bandwidth is not None) for r in rows)


def test_latency_reports_the_hosts_share_of_each_step(capsys) -> None:
    """host_busy_ms_per_step: each step less the host's wait for the GPU's output, so never
    more than the step; on the CPU, where nothing runs beside the host, about all of it."""
    from cadence.engine.core import EngineCore
    from cadence.engine.engine_args import EngineArgs

    assert latency.main([*TINY, "--batch-sizes", "1", "--input-len", "8", "--output-len", "6",
                         "--repeats", "1", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["figures"]["results"][0]
    assert 0 < row["host_busy_ms_per_step"] <= row["decode_ms_per_step"] + 1e-3
    core = EngineCore(EngineArgs(model="tiny", device="cpu", max_model_len=64, max_num_seqs=2,
                                 skip_tokenizer_init=True))
    try:
        before = latency._output_wait_s(core)
        steps = latency.run_batch(core, 2, 8, 6, seed=0)
        assert len(steps) == 4  # six tokens: the prefill's, then five steps of which four timed
        assert all(0 <= wait <= step for step, wait in steps)
        assert latency._output_wait_s(core) > before  # every step's output was waited for
    finally:
        core.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_latency_times_only_decode_steps_of_the_whole_batch(async_scheduling) -> None:
    """Two 8-token prompts under an 8-token step budget: step 1 prefills A (A's first token),
    step 2 decodes A beside 7 of B's prompt tokens, step 3 decodes A and ends B's prefill (B's
    first token), steps 4-6 decode both (A's sixth token ends it), steps 7-8 decode B alone.
    Both A and B decode in steps 4, 5 and 6 only: two steps timed, from 4 to 5 and 5 to 6."""
    from cadence.engine.core import EngineCore
    from cadence.engine.engine_args import EngineArgs

    core = EngineCore(EngineArgs(model="tiny", device="cpu", max_model_len=64, max_num_seqs=2,
                                 max_num_batched_tokens=8, enable_chunked_prefill=True,
                                 skip_tokenizer_init=True, async_scheduling=async_scheduling))
    try:
        assert len(latency.run_batch(core, 2, 8, 6, seed=0)) == 2
    finally:
        core.shutdown()


def test_latency_refuses_max_num_seqs_below_the_batch(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        latency.main([*TINY, "--batch-sizes", "1,4", "--max-num-seqs", "2"])
    assert exc.value.code == 2 and "--max-num-seqs 2" in capsys.readouterr().err


def test_latency_says_so_when_no_step_decodes_the_whole_batch(capsys) -> None:
    # Three 8-token prompts under an 8-token budget with four tokens each: the first is done
    # before the third has its first token, so no step decodes all three.
    with pytest.raises(SystemExit, match="no decode step ran all 3 requests"):
        latency.main([*TINY, "--batch-sizes", "3", "--input-len", "8", "--output-len", "4",
                      "--repeats", "1", "--max-num-batched-tokens", "8",
                      "--enable-chunked-prefill"])


def test_a_thousand_is_written_with_its_separator() -> None:
    """From 1,000 up a float is whole with separators; below, 4 significant digits."""
    assert [fmt(v) for v in (1000.0, -1000.0, 999.94, 1000.4)] == [
        "1,000", "-1,000", "999.9", "1,000"]


def test_no_progress_bar_with_json_or_no_progress() -> None:
    """--json keeps stderr free of the bar as --no-progress does (a script reads the line)."""
    from cadence.bench.report import progress

    p = argparse.ArgumentParser()
    add_report_args(p)
    for argv, disabled in ((["--json"], True), (["--no-progress"], True),
                           (["--json", "--no-progress"], True), ([], False)):
        bar = progress(range(2), p.parse_args(argv), "x")
        assert bar.disable is disabled, argv  # type: ignore[attr-defined]
        assert list(bar) == [0, 1]
