"""The suite cannot hang: pytest-timeout is active, with a shorter limit for unit tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import UNIT_TEST_TIMEOUT_S


def test_every_test_has_a_time_limit(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.hasplugin("timeout")
    assert float(request.config.getini("timeout")) >= 300
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None and marker.args[0] == UNIT_TEST_TIMEOUT_S


def _mutation_check() -> ModuleType:
    """scripts/mutation_check.py loaded as a module (with its registries)."""
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("mutation_check",
                                                  root / "scripts" / "mutation_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_every_planted_bug_still_finds_its_code() -> None:
    """scripts/mutation_check.py plants each bug by replacing one exact snippet: a refactor that
    moves the code must update the snippet, or the check would test nothing."""
    module = _mutation_check()
    root = Path(__file__).resolve().parents[1]
    stale = [m.id for m in module.MUTATIONS if (root / m.path).read_text().count(m.old) != 1]
    assert not stale, f"snippets not found exactly once: {stale}"
    assert len({m.id for m in module.MUTATIONS}) == len(module.MUTATIONS)


def test_the_baseline_flags_a_test_list_that_fails_without_a_planted_bug(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``mutation_check.py --baseline`` runs each distinct test list once in an unmutated copy
    and names a list that fails there (whose 'caught' would mean nothing)."""
    module = _mutation_check()
    ran: list[tuple[str, ...]] = []

    def fake_pytest(tree: Path, tests: tuple[str, ...], gpu: bool) -> tuple[int, float, str]:
        assert (tree / "scripts" / "mutation_check.py").is_file()  # a copy of the tree
        ran.append(tests)
        return (1, 0.0, "FAILED a") if tests == ("tests/b.py",) else (0, 0.0, "")

    monkeypatch.setattr(module, "_pytest", fake_pytest)
    monkeypatch.setattr(module, "_copy_tree",
                        lambda dest: (dest / "scripts").mkdir(parents=True)
                        or (dest / "scripts" / "mutation_check.py").write_text(""))
    m = module.Mutation
    chosen = [m(name, "", "p", "o", "n", (f"tests/{file}.py",))
              for name, file in (("x", "a"), ("y", "b"), ("z", "a"))]
    assert module._baseline(chosen, gpu=False) == 1
    assert ran == [("tests/a.py",), ("tests/b.py",)]  # each distinct list once
    out = capsys.readouterr().out
    assert "| tests/b.py | **NO** |" in out and "1 of 2 test lists pass" in out
    ran.clear()
    assert module._baseline(chosen[:1], gpu=False) == 0 and ran == [("tests/a.py",)]
