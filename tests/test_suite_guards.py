"""The suite cannot hang: pytest-timeout is active, with a shorter limit for unit tests."""

from __future__ import annotations

import pytest

from tests.conftest import UNIT_TEST_TIMEOUT_S


def test_every_test_has_a_time_limit(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.hasplugin("timeout")
    assert float(request.config.getini("timeout")) >= 300
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None and marker.args[0] == UNIT_TEST_TIMEOUT_S


def test_every_planted_bug_still_finds_its_code() -> None:
    """scripts/mutation_check.py plants each bug by replacing one exact snippet: a refactor that
    moves the code must update the snippet, or the check would test nothing."""
    import importlib.util
    import sys
    from pathlib import Path

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
    stale = [m.id for m in module.MUTATIONS if (root / m.path).read_text().count(m.old) != 1]
    assert not stale, f"snippets not found exactly once: {stale}"
    assert len({m.id for m in module.MUTATIONS}) == len(module.MUTATIONS)
