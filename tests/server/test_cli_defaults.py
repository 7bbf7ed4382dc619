"""``cadence serve``'s on/off flags start where vLLM's do: off, each turned on by its flag alone."""

from __future__ import annotations

import argparse

import pytest

from cadence.server.cli import add_serve_args

# vLLM's serve flags that are off unless given.
_OFF = ["allow_credentials", "enable_prompt_tokens_details", "enable_force_include_usage",
        "trust_request_chat_template", "enable_log_requests"]


def _parse(*argv: str) -> argparse.Namespace:
    return add_serve_args(argparse.ArgumentParser()).parse_args(list(argv))


def test_off_by_default() -> None:
    ns = _parse()
    assert {dest: getattr(ns, dest) for dest in _OFF} == dict.fromkeys(_OFF, False)


@pytest.mark.parametrize("dest", _OFF)
def test_each_flag_turns_on_its_own_setting_alone(dest: str) -> None:
    ns = _parse("--" + dest.replace("_", "-"))
    assert {d: getattr(ns, d) for d in _OFF} == {d: d == dest for d in _OFF}
    assert getattr(_parse("--" + dest.replace("_", "-"), "--disable-log-requests"),
                   dest) is (dest != "enable_log_requests")
