"""examples/ run as they are: the runtime demo on the CPU backend (Numba's simulator) and the
step-loop example here, and every example on a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import child_env

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    # This checkout's cadence first, not an installed one; what the caller's path adds stays.
    env = child_env()
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.timeout(300)
def test_runtime_demo_on_the_cpu_backend() -> None:
    pytest.importorskip("numba")
    proc = _run("examples/runtime_demo.py", "--cpu", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "combine and scatter: HostTokenKernels" in out
    assert out.count("row sums on the host") == 3 and out.rstrip().endswith("runtime demo ok")


@pytest.mark.timeout(300)
def test_llm_engine_example() -> None:
    """The step loop example: every request but the aborted one finishes, both choices of the
    n=2 request come in its one final output, and the aborted one never says finished."""
    proc = _run("examples/llm_engine.py", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    finished = [line.split(" (")[0] for line in proc.stdout.splitlines()
                if line.startswith("request ") and " choice " in line]
    assert sorted(finished) == ["request 0 choice 0", "request 1 choice 0",
                                "request 2 choice 0", "request 2 choice 1"]
    assert "request 3 aborted after 5 tokens" in proc.stdout
    assert proc.stdout.rstrip().endswith("llm engine example ok")


@pytest.mark.gpu
def test_runtime_demo_on_a_gpu() -> None:
    proc = _run("examples/runtime_demo.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "combine and scatter: NumbaTokenKernels" in proc.stdout
    kernels = int(proc.stdout.split("captured graph: ")[1].split()[0])
    assert kernels >= 3, proc.stdout  # matmul, the Numba kernel, relu


@pytest.mark.gpu
def test_triton_decode_bench_quick() -> None:
    proc = _run("examples/triton_decode_bench.py", "--quick", "--replays", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "decode attention" in proc.stdout and "prefill" in proc.stdout


@pytest.mark.gpu
def test_launch_cost_script_prints_every_row() -> None:
    proc = _run("scripts/launch_cost.py", "--launches", "32", "--repeats", "3", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    figures = json.loads(proc.stdout)["us_per_launch"]
    bound = [v for k, v in figures.items() if k.startswith("cadence: bind")]
    assert len(bound) == 3 and all(isinstance(v, float) for v in bound), figures


@pytest.mark.parametrize(
    ("argv", "names"),
    [(["--lens", "abc"], "--lens"), (["--lens", "1024,0"], "--lens"),
     (["--heads", "5"], "--heads"), (["--head-dim", "60"], "--head-dim")],
)
def test_prefill_attention_compare_refuses_bad_input_in_one_line(argv, names) -> None:
    proc = _run("scripts/prefill_attention_compare.py", *argv, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("prefill_attention_compare.py: error:") and names in last
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(300)
def test_ttft_phases_times_each_phase_of_a_request() -> None:
    proc = _run("scripts/ttft_phases.py", "--model", "tiny", "--input-len", "32", "--repeats",
                "3", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if " n=" in line}
    for phase in ("TTFT", "add_request", "schedule", "apply", "prepare", "upload"):
        assert phase in rows, proc.stdout
    assert "n=   3" in rows["TTFT"] and "n=   3" in rows["add_request"]


def test_ttft_phases_timeline_refuses_a_machine_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = _run("scripts/ttft_phases.py", "--model", "tiny", "--input-len", "16", "--repeats",
                "1", "--timeline", timeout=240)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--timeline needs a CUDA device" in proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr


@pytest.mark.gpu
def test_ttft_phases_timeline_on_a_gpu() -> None:
    proc = _run("scripts/ttft_phases.py", "--model", "tiny", "--device", "cuda", "--input-len",
                "32", "--repeats", "4", "--timeline")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "GPU, first launch -> its graph's end" in out, out
    for phase in ("add_request #0", "graph launch #0", "wait for ids #0", "update #0"):
        assert phase in out, out


def test_with_tables_extends_the_bulk_tables_from_the_sweeps_json(tmp_path, monkeypatch) -> None:
    import importlib.util
    import json

    from cadence.model import bulk_gemv, bulk_mma

    spec = importlib.util.spec_from_file_location("with_tables", ROOT / "scripts/with_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(bulk_gemv, "BULK_FP8_CONFIGS", {})
    monkeypatch.setattr(bulk_gemv, "BULK_CONFIGS", {})
    monkeypatch.setattr(bulk_mma, "MMA_CONFIGS", {})
    fp8 = tmp_path / "fp8.json"
    fp8.write_text(json.dumps({"weights": "fp8", "table": [
        {"n": 4096, "k": 4096, "mode": "plain", "rows": 8, "stages": 3, "threads": 512,
         "hw_cvt": True, "us": 7.0, "today_us": 8.0}]}))
    bf16 = tmp_path / "bf16.json"  # written before hw_cvt existed: no such field
    bf16.write_text(json.dumps({"weights": "bf16", "table": [
        {"n": 64, "k": 512, "mode": "norm", "rows": 4, "stages": 2, "threads": 256}]}))
    mma = tmp_path / "mma.json"
    mma.write_text(json.dumps([[1024, 512, "glu", "fp8", 8, [16, 512, 2, 256, False]]]))
    assert [module.load(str(p)) for p in (fp8, bf16, mma)] == [1, 1, 1]
    assert bulk_gemv.BULK_FP8_CONFIGS == {
        (4096, 4096, "plain"): bulk_gemv.BulkConfig(8, 3, 512, hw_cvt=True)}
    assert bulk_gemv.BULK_CONFIGS == {(64, 512, "norm"): bulk_gemv.BulkConfig(4, 2, 256)}
    assert bulk_mma.MMA_CONFIGS == {
        (1024, 512, "glu", "fp8", 8): bulk_mma.MmaConfig(16, 512, 2, 256, padded=False)}
    assert module.main([]) == 2  # no table file: the usage, not the CLI


def test_with_tables_runs_a_script_after_the_tables(tmp_path) -> None:
    import json

    table = tmp_path / "t.json"
    table.write_text(json.dumps({"weights": "fp8", "table": [
        {"n": 96, "k": 512, "mode": "plain", "rows": 4, "stages": 2, "threads": 256}]}))
    probe = tmp_path / "probe.py"
    probe.write_text("import sys\nfrom cadence.model import bulk_gemv\n"
                     "print(sorted(bulk_gemv.BULK_FP8_CONFIGS)[0], sys.argv[1:])\n"
                     "raise SystemExit(3)\n")
    proc = _run("scripts/with_tables.py", str(table), str(probe), "--flag", timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "(96, 512, 'plain') ['--flag']" in proc.stdout


@pytest.mark.parametrize("text", ["nope", '{"weights": "int4", "table": []}',
                                  '{"weights": "fp8", "table": [{"n": 1}]}',
                                  '[[1, 2, "plain", "bf16", 1, [16, 512, 2, 100, true]]]'])
def test_with_tables_refuses_a_bad_table_in_one_line(tmp_path, text: str) -> None:
    table = tmp_path / "bad.json"
    table.write_text(text)
    proc = _run("scripts/with_tables.py", str(table), "bench", "latency", timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith(f"{table}: not a table file the sweeps write")


def test_kernel_profile_exposed_times() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernel_profile", ROOT / "scripts/kernel_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # B runs inside A; C starts inside A and ends 2 after it; D after a gap; E overlaps D by 4.
    spans = [(0.0, 10.0), (2.0, 5.0), (4.0, 12.0), (20.0, 25.0), (21.0, 30.0)]
    assert module.exposed_times(spans) == [10.0, 0.0, 2.0, 5.0, 5.0]
    # Order of the list does not matter, only start times: the same spans reversed.
    assert module.exposed_times(spans[::-1]) == [5.0, 5.0, 2.0, 0.0, 10.0]
    assert module.exposed_times([]) == []


def test_bulk_mma_phases_splices_every_stamp() -> None:
    """The phase script's stamps land in bulk_mma's current source: each anchor once (a kernel
    change that moves one fails here, on the CPU, rather than on the next GPU run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bulk_mma_phases",
                                                  ROOT / "scripts/bulk_mma_phases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    src = module.stamped_source()
    stamps = [src.index(f"T{i} = gt()") for i in range(4)]
    assert stamps == sorted(stamps) and "unsigned long long* __restrict__ stamp)" in src
    # The norm prologue's two inner stamps, in order inside it.
    inner = [src.index("TA = gt();"), src.index("TB = gt();")]
    assert stamps[1] < inner[0] < inner[1] < stamps[2]
    assert src.index("griddepcontrol.wait") < stamps[1] < src.index("mbar_wait(bars + 8u")
    from cadence.model.bulk_gemv import nvrtc_ok

    if nvrtc_ok():  # and it compiles for Hopper (NVRTC needs no GPU)
        from cadence.model.bulk_mma_kernel import KERNEL, defines
        from cadence.runtime.module import compile_cuda

        for mode in (0, 1):
            options = defines(16, 1024, 2, 256, mode, mode == 1, False)
            assert KERNEL.encode() in compile_cuda(src, "phases.cu", "sm_90", options)
    # The late variant asks for the first stages once, after the prologue's last barrier.
    late = module.stamped_source("late")
    issue = "issue(w, first, my_rows, k, nkc, wrow, i, stages, bars);"
    assert late.count(issue) == src.count(issue) == 1
    assert src.index("griddepcontrol.wait") > src.index(issue)
    assert late.index("T2 = gt()") < late.index(issue) < late.index("mbar_wait(bars + 8u")
    if nvrtc_ok():
        assert KERNEL.encode() in compile_cuda(late, "late.cu", "sm_90",
                                               defines(32, 1024, 1, 256, 1, True, False))
    # The engine's sums of squares take the bucket's rows in one pass; the serial variant puts
    # back the row-after-row loop, and only that.
    serial = module.stamped_source("serial")
    assert src.count("float lanes[BM_MR][LPT];") == 1
    assert src.index("TA = gt();") < src.index("lanes[BM_MR]") < src.index("TB = gt();")
    assert "lanes[BM_MR]" not in serial
    assert serial.count("for (int r = 0; r < m; r++) {\n        const u16* sr") == 1
    assert serial.index("TA = gt();") < serial.index("float lanes[LPT];") < serial.index("TB = gt();")
    if nvrtc_ok():
        for mr in (1, 8):
            for variant in (src, serial):
                assert KERNEL.encode() in compile_cuda(
                    variant, "rows.cu", "sm_90",
                    defines(16, 1024, 2, 256, 1, True, False, max_rows=mr))


def test_bulk_mma_phases_refuses_bad_arguments_in_one_line() -> None:
    for argv in (["--shapes", "qkv,bogus"], ["--rows", "0,9"], ["--rows", "x"], ["--calls", "0"],
                 ["--variants", "engine,early"]):
        proc = _run("scripts/bulk_mma_phases.py", *argv, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, argv
        assert proc.stderr.strip().splitlines()[-1].startswith("bulk_mma_phases.py: error: --")


@pytest.mark.gpu
def test_bulk_mma_phases_script() -> None:
    proc = _run("scripts/bulk_mma_phases.py", "--rows", "1,8", "--shapes", "qkv,o", "--calls",
                "20", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.startswith(("qkv ", "o "))]
    assert [(r[0], r[1]) for r in rows] == [("qkv", "1"), ("qkv", "8"), ("o", "1"), ("o", "8")]
    assert "WRONG" not in proc.stdout
