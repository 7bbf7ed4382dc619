from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "nsys" / "nsys_profile.sh"


def _run(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    bash = shutil.which("bash") or "/bin/bash"
    return subprocess.run(
        [bash, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=30
    )


def test_missing_nsys_exits_with_a_clear_message(tmp_path) -> None:
    # A PATH holding only the tools the script needs before it looks for nsys.
    dirname = shutil.which("dirname")
    assert dirname is not None
    (tmp_path / "dirname").symlink_to(dirname)
    r = _run("--batch-size", "2", path=str(tmp_path))
    assert r.returncode == 3
    assert "'nsys') is not on PATH" in r.stderr and "torch_trace.py" in r.stderr


def test_dry_run_commands() -> None:
    r = _run("--dry-run", "-o", "/tmp/run", "--batch-size", "32", "--steps", "50")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(
        "CADENCE_NVTX=1 nsys profile -t cuda,nvtx,osrt "
        "--capture-range=cudaProfilerApi --capture-range-end=stop -o /tmp/run"
    )
    assert lines[0].endswith("--profiler cuda-api --batch-size 32 --steps 50")
    assert lines[2] == "nsys export -q -t sqlite -f true -o /tmp/run.sqlite /tmp/run.nsys-rep"
    assert lines[3].endswith("gaps.py /tmp/run.sqlite > /tmp/run_gaps.txt")

    plain = _run("--dry-run", "--plain").stdout.splitlines()[0]
    assert "--capture-range" not in plain and "--profiler none" in plain

    cmd = _run("--dry-run", "--command", "python", "x.py", "--plain").stdout.splitlines()[0]
    assert cmd.endswith("-o cadence_nsys -f true python x.py --plain")
    assert "--capture-range" not in cmd
