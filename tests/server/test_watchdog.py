"""The engine watchdog over a stand-in engine: what /health is told, and one log line per
change of state (a death, a stall, a recovery) however often it is asked."""

from __future__ import annotations

import logging

import pytest

from cadence.server.watchdog import EngineWatchdog


class _Engine:
    """What the watchdog reads of an engine, set by the test."""

    def __init__(self) -> None:
        self.errored = False
        self.waited = 0.0
        self.unfinished = 2
        self.output_processor = self

    def seconds_without_progress(self) -> float:
        return self.waited

    def get_num_unfinished_requests(self) -> int:
        return self.unfinished


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.mark.parametrize("timeout", [0.0, -1.0, float("nan")])
def test_a_stall_timeout_must_be_positive(timeout: float) -> None:
    with pytest.raises(ValueError, match="stall_timeout must be positive"):
        EngineWatchdog(_Engine(), timeout)


def test_each_stall_and_each_recovery_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Two stalls, each asked about (a /health, a tick) three times, each followed by
    progress asked about three times: two stall lines and two recovery lines in all."""
    caplog.set_level(logging.INFO, logger="cadence.server.watchdog")
    engine = _Engine()
    dog = EngineWatchdog(engine, stall_timeout=10.0)
    assert dog.problem() is None
    for _ in range(2):
        engine.waited = 12.5
        for _ in range(3):
            reason = dog.problem()
            assert reason is not None and "2 unfinished request(s)" in reason
            assert "12.5 s (limit 10 s)" in reason
        engine.waited = 0.5
        for _ in range(3):
            assert dog.problem() is None
    assert len(_logged(caplog, "stalled")) == 2
    assert len(_logged(caplog, "completes steps again")) == 2
    assert not dog.dead


def test_a_dead_engine_is_reported_at_every_check_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """Dead (its core stopped) and past the stall timeout too: each check says it is not
    running; the log says so once, and says nothing of a stall."""
    caplog.set_level(logging.INFO, logger="cadence.server.watchdog")
    engine = _Engine()
    dog = EngineWatchdog(engine, stall_timeout=10.0)
    engine.errored, engine.waited = True, 30.0
    for _ in range(3):
        assert dog.problem() == "The engine is not running."
    assert dog.dead
    assert len(_logged(caplog, "not running")) == 1
    assert _logged(caplog, "stalled") == []
