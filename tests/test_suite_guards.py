"""The suite cannot hang: pytest-timeout is active, with a shorter limit for unit tests."""

from __future__ import annotations

import pytest

from tests.conftest import UNIT_TEST_TIMEOUT_S


def test_every_test_has_a_time_limit(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.hasplugin("timeout")
    assert float(request.config.getini("timeout")) >= 300
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None and marker.args[0] == UNIT_TEST_TIMEOUT_S
