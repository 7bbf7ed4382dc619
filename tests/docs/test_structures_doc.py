"""docs/structures.md lists every module, script and trace tool, and nothing that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _listed() -> set[str]:
    text = (ROOT / "docs" / "structures.md").read_text()
    return set(re.findall(r"`((?:cadence|nsys|scripts)/[^`\s]+)`", text))


def _files() -> set[str]:
    found = {p for p in (ROOT / "cadence").rglob("*.py") if "__pycache__" not in p.parts}
    found |= {p for p in (ROOT / "nsys").iterdir() if p.suffix in (".py", ".sh", ".md")}
    found |= {p for p in (ROOT / "scripts").iterdir() if p.suffix in (".py", ".sh")}
    return {str(p.relative_to(ROOT)) for p in found}


def test_every_module_is_listed() -> None:
    missing = sorted(_files() - _listed())
    assert not missing, f"add these to docs/structures.md: {missing}"


def test_nothing_listed_is_gone() -> None:
    gone = sorted(p for p in _listed() if not (ROOT / p).exists())
    assert not gone, f"docs/structures.md lists files that do not exist: {gone}"


def test_the_life_of_a_request_and_the_thread_map_are_there() -> None:
    text = (ROOT / "docs" / "structures.md").read_text()
    life = text.split("## The life of a request", 1)[1].split("\n## ", 1)[0]
    steps = re.findall(r"^(\d+)\. \*\*", life, re.M)
    assert [int(s) for s in steps] == list(range(1, len(steps) + 1)) and len(steps) >= 10
    assert "## Threads and streams" in text and "*copy*" in text
