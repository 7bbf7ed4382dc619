"""The command lines' value types: token counts with suffixes, bounded integers, their lists,
and optional integers."""

from __future__ import annotations

import argparse

import pytest

from cadence.cli_types import (
    human_readable_int,
    human_readable_int_or_auto,
    int_at_least,
    int_list_at_least,
    int_or_none,
)


@pytest.mark.parametrize(("text", "value"), [
    ("1g", 1_000_000_000), ("1G", 1_073_741_824), ("3M", 3 * 1_048_576), ("2m", 2_000_000),
    ("5K", 5120), (" 4k ", 4000), ("1.5k", 1500), ("7", 7), ("2T", 2 * 1_099_511_627_776),
])
def test_suffixes_scale_by_thousands_or_by_1024(text: str, value: int) -> None:
    assert human_readable_int(text) == value


def test_auto_is_minus_one_and_other_counts_pass_through() -> None:
    assert human_readable_int_or_auto(" AUTO ") == -1
    assert human_readable_int_or_auto("2K") == 2048


def test_a_bound_is_inclusive() -> None:
    one = int_at_least(1, "a step")
    assert one("1") == 1 and one("12") == 12
    with pytest.raises(argparse.ArgumentTypeError, match=r">= 1 \(a step\), got '0'"):
        one("0")
    with pytest.raises(argparse.ArgumentTypeError):
        one("x")
    assert int_at_least(0)("0") == 0


def test_a_list_checks_every_item() -> None:
    parse = int_list_at_least(2)
    assert parse("2, 3,40") == [2, 3, 40]
    assert parse("5") == [5]
    with pytest.raises(argparse.ArgumentTypeError, match="got '1'"):
        parse("2,3,1")


@pytest.mark.parametrize("text", ["None", "none", " NONE "])
def test_none_in_any_case_is_none(text: str) -> None:
    assert int_or_none(text) is None


def test_an_optional_integer() -> None:
    assert int_or_none("7") == 7 and int_or_none("-3") == -3
    with pytest.raises(argparse.ArgumentTypeError, match="integer or None"):
        int_or_none("seven")
