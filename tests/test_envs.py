"""The environment switches' words for on and off, and the warning for anything else."""

from __future__ import annotations

import warnings

import pytest

from cadence.envs import read_envs

NAME = "CADENCE_DISABLE_LAUNCH_TAPES"


@pytest.mark.parametrize(
    ("value", "on"),
    [("1", True), ("true", True), (" Yes ", True), ("ON", True),
     ("0", False), ("false", False), ("No", False), ("off", False)],
)
def test_the_words_for_on_and_off(monkeypatch, value, on):
    monkeypatch.setenv(NAME, value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a recognized word warns about nothing
        assert read_envs().disable_launch_tapes is on


@pytest.mark.parametrize("value", ["ture", "2", "enabled"])
def test_any_other_value_reads_as_off_and_says_so(monkeypatch, value):
    monkeypatch.setenv(NAME, value)
    with pytest.warns(UserWarning, match=f"{NAME}='{value}' is neither on"):
        assert read_envs().disable_launch_tapes is False


def test_unset_or_empty_is_the_default(monkeypatch):
    monkeypatch.delenv("CADENCE_ASYNC_SCHEDULING", raising=False)
    assert read_envs().async_scheduling is None
    monkeypatch.setenv("CADENCE_ASYNC_SCHEDULING", "")
    assert read_envs().async_scheduling is None
