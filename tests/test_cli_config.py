"""``--config FILE.yaml``, dotted keys and the JSON option types (cadence/cli_config.py) over a
small parser of their own: what argparse is handed, and the mistakes refused with a line."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cadence.cli_config import (
    add_config_arg,
    expand_config,
    json_object,
    json_object_or_int,
    json_string_list,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    add_config_arg(p)
    p.add_argument("--enable-x", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--name")
    p.add_argument("--tags", nargs="+")
    p.add_argument("--context", type=int)
    p.add_argument("--hf-overrides", type=json_object)
    p.add_argument("--level", type=json_object_or_int)
    return p


def _file(tmp_path: Path, text: str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = _parser()
    return p.parse_args(expand_config(p, argv))


def test_false_for_a_no_key_gives_the_positive_switch(tmp_path: Path) -> None:
    # "no-enable-x: false" is "not --no-enable-x": --enable-x (and true the --no- form).
    assert _parse(["--config", _file(tmp_path, "no-enable-x: false\n")]).enable_x is True
    assert _parse(["--config", _file(tmp_path, "no-enable-x: true\n")]).enable_x is False
    assert _parse(["--config", _file(tmp_path, "enable_x: false\n")]).enable_x is False


def test_one_config_file_only(tmp_path: Path) -> None:
    a, b = _file(tmp_path, "name: a\n", "a.yaml"), _file(tmp_path, "name: b\n", "b.yaml")
    with pytest.raises(ValueError, match="--config given 2 times"):
        expand_config(_parser(), ["--config", a, f"--config={b}"])


def test_help_is_no_key_of_a_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown option 'help'"):
        expand_config(_parser(), ["--config", _file(tmp_path, "help: true\n")])


def test_a_boolean_value_keeps_yamls_spelling(tmp_path: Path) -> None:
    ns = _parse(["--config", _file(tmp_path, "name: true\ntags: [false, x]\n")])
    assert (ns.name, ns.tags) == ("true", ["false", "x"])


def test_a_null_list_item_is_refused(tmp_path: Path) -> None:
    # A top-level null leaves the default; a null item has no text to give.
    assert _parse(["--config", _file(tmp_path, "name: null\n")]).name is None
    with pytest.raises(ValueError, match="tags: a list item may not be null"):
        expand_config(_parser(), ["--config", _file(tmp_path, "tags: [a, null]\n")])


def test_not_a_number_is_no_json_value(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expected JSON values only"):
        expand_config(_parser(), ["--config", _file(tmp_path, "hf-overrides: {a: .nan}\n")])


def test_a_yaml_error_names_its_line(tmp_path: Path) -> None:
    path = _file(tmp_path, "name: x\n\tlevel: 3\n")  # a tab cannot start a token: line 2
    with pytest.raises(ValueError, match=r"not valid YAML \(line 2\)"):
        expand_config(_parser(), ["--config", path])


def test_an_object_whole_and_by_dotted_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="given both whole and with dotted keys"):
        expand_config(_parser(), ["--hf-overrides", '{"a": 1}', "--hf-overrides.b", "2"])
    assert _parse(["--hf-overrides.a", "1", "--hf-overrides.b.c", "x"]).hf_overrides == {
        "a": 1, "b": {"c": "x"}}


def test_only_an_unambiguous_abbreviation_is_the_config_file(tmp_path: Path) -> None:
    path = _file(tmp_path, "name: f\n")
    # "--conf" abbreviates --config alone (argparse takes it so): its file is read.
    assert _parse(["--conf", path]).name == "f"
    # "--con" is also --context's: left to argparse, which refuses it as ambiguous.
    assert expand_config(_parser(), ["--con", "3"]) == ["--con", "3"]


def test_the_json_option_types() -> None:
    assert json_object_or_int("3") == 3
    assert json_object_or_int('{"a": 1}') == {"a": 1}
    for text in ("true", "false", "1.5", '"3"', "[1]"):
        with pytest.raises(argparse.ArgumentTypeError):
            json_object_or_int(text)
    assert json_string_list('["a", "b"]') == ["a", "b"]
    for text in ('["a", 1]', '[null]', '"a"', "{}"):
        with pytest.raises(argparse.ArgumentTypeError):
            json_string_list(text)
