"""CI does what the README says: its install command and its test command, nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parent.parent


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.S)


def test_ci_runs_the_readme_install_and_test_commands() -> None:
    first, tests = _bash_blocks((ROOT / "README.md").read_text())[:2]
    install = [c.strip() for c in first.strip().split("&&")]
    assert install[0].startswith("python3 -m venv") and install[-1] == "cadence serve"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    # The README's install steps between the venv and the server, in order, then its tests.
    steps = [c for c in install[2:-1]]
    positions = [ci.index(step) for step in steps]
    assert positions == sorted(positions)
    assert tests.strip() in ci and ci.index(tests.strip()) > positions[-1]


def test_the_gpu_runtime_comes_with_a_linux_install() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"]
    for name in ("cuda-python", "numba-cuda"):
        assert any(d.startswith(name) and "sys_platform == 'linux'" in d for d in deps), name
    extras = project["optional-dependencies"]
    assert extras["cuda12"] == ["cupy-cuda12x"] and extras["cuda13"] == ["cupy-cuda13x"]


def test_the_install_script_keeps_cpu_machines_on_the_cpu_build() -> None:
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert "nvidia-smi" in script
    assert "--index-url https://download.pytorch.org/whl/cpu" in script
    assert "--no-index" in script  # a local wheel folder first: no network where one exists
