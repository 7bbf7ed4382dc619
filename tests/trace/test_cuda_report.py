"""``cadence trace`` on a CUDA device with the tiny model (skipped without CUDA)."""

from __future__ import annotations

import json
import shutil

import pytest

from cadence.cli import main as cadence_main
from nsys.gaps import summarize

TINY = ["--model", "tiny", "--device", "cuda", "--batch-size", "4", "--input-len", "16",
        "--steps", "6", "--warmup-steps", "3"]


def _report(tmp_path, *extra: str) -> dict:
    argv = ["trace", *TINY, *extra, "--out", str(tmp_path / "r.html"),
            "--json-out", str(tmp_path / "r.json")]
    assert cadence_main(argv) == 0
    return json.loads((tmp_path / "r.json").read_text())


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [[], ["--enforce-eager"]], ids=["graphs", "eager"])
def test_cuda_report_rows_are_kernels(tmp_path, mode) -> None:
    figures = _report(tmp_path, *mode)
    summary = figures["summary"]
    assert summary == json.loads(json.dumps(summarize(tmp_path / "r.trace.json")))
    assert summary["has_gpu"] and summary["num_steps"] == 6
    assert summary["attribution"]["launch"] + summary["attribution"]["op"] > 0
    assert figures["reference"] == "gpu_busy_us"
    classes = {r["cls"] for r in figures["kernels"]}
    assert {"gemm", "attention"} <= classes
    gemm = next(c for c in figures["classes"] if c["class"] == "gemm")
    assert gemm["bytes_per_step"] and gemm["gbps"] > 0
    # A kernel's calls per step times its time per call is its time per step.
    for r in figures["kernels"]:
        assert r["us_per_step"] == pytest.approx(r["calls_per_step"] * r["us_per_call"])


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nsys") is None, reason="needs Nsight Systems (nsys)")
def test_cuda_report_under_nsys(tmp_path) -> None:
    figures = _report(tmp_path, "--profiler", "nsys")
    assert figures["summary"]["has_gpu"] and figures["summary"]["num_steps"] == 6
    assert figures["run"]["profiler"] == "cuda-api"
    assert {"schedule", "update"} <= set(figures["summary"]["phases_us"])
