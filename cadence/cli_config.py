"""vLLM's ways of writing options: ``--config FILE.yaml``, underscores in option names and
dotted keys of JSON-object options (``--hf-overrides.rope_theta 1e6``).

A config file is a YAML mapping of long option names (``max-model-len``, ``max_model_len`` or
``--max-model-len``) to values. Its options go in front of the command line's, so that a flag
given on the command line wins (as in vLLM); a repeatable flag given there replaces the file's
list. ``true`` gives a switch, ``false`` its ``--no-``
form where there is one; a list gives a repeatable flag once per item, a flag that takes several
values (``served-model-name``) its items, or a JSON list where the flag takes one
(``allowed-origins``); ``null`` leaves the default. Every key and value is checked here, so that a
mistake is one line naming the file and the key.

The file's options go after the command line's leading positional arguments (before its first
option), so that a list-valued option is always followed by an option or nothing: argparse would
take a positional right after it (``cadence serve MODEL``) for one more item.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["FILE_MODEL", "add_config_arg", "config_paths", "expand_config", "flags_with_config",
           "json_object",
           "json_object_or_int", "json_string_list", "parse_with_config"]

_CONFIG = "--config"
# The model a --config file names, where a command takes its model as a positional (serve).
FILE_MODEL = "--file-model"


def add_config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        _CONFIG,
        metavar="FILE.yaml",
        default=None,
        help="read options from a YAML mapping of long option names to values (as vLLM's "
        "--config); flags on the command line override them",
    )


def parse_with_config(parser: argparse.ArgumentParser, argv: Sequence[str] | None
                      ) -> argparse.Namespace:
    """``parser.parse_args`` of ``argv`` (``sys.argv[1:]`` if None) as ``expand_config`` reads
    it: a ``--config`` file's options, dotted keys, underscores in names. The parser has
    ``add_config_arg``'s option."""
    return parser.parse_args(expand_config(parser, sys.argv[1:] if argv is None else argv))


def json_string_list(text: str) -> list[str]:
    """An argparse ``type``: a JSON list of strings, e.g. ``'["https://a.example"]'``."""
    value = _json_arg(text, "a JSON list of strings", "'[\"*\"]'")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings, got {text!r}")
    return value


def json_object(text: str) -> dict[str, Any]:
    """An argparse ``type``: a JSON object, e.g. ``'{"max_position_embeddings": 4096}'``."""
    value = _json_arg(text, "a JSON object", "'{\"key\": 1}'")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def json_object_or_int(text: str) -> dict[str, Any] | int:
    """An argparse ``type``: a JSON object or an integer (vLLM's ``-O3``-style levels)."""
    value = _json_arg(text, "a JSON object or an integer", "'{\"key\": 1}' or 3")
    if isinstance(value, bool) or not isinstance(value, (dict, int)):
        raise argparse.ArgumentTypeError(f"expected a JSON object or an integer, got {text!r}")
    return value


def _json_arg(text: str, what: str, example: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"expected {what} such as {example}, got {text!r}"
                                         ) from None


def expand_config(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``argv`` (a subcommand's arguments) with underscores in option names turned into dashes
    and the options of its ``--config`` file, if any, after its leading positionals and before
    its own options. ``ValueError`` for a mistake in the file."""
    args = _folded(parser, _normalized(parser, argv))
    paths = config_paths(args)
    if not paths:
        return args
    if len(paths) > 1:
        raise ValueError(f"{_CONFIG} given {len(paths)} times; give one file.")
    first = next((i for i, a in enumerate(args) if a.startswith("-") and a != "-"), len(args))
    actions = parser._option_string_actions  # argparse has no public lookup
    # A repeatable flag on the command line replaces the file's list instead of adding to it.
    given = {id(actions[name]) for a in args[first:]
             if (name := a.partition("=")[0]) in actions}
    from_file = _file_args(parser, paths[0], given)
    if FILE_MODEL in actions:
        # serve's file model is its own option: a positional model, wherever it stands, wins
        # over it (vLLM's), a --model on the command line too.
        if id(actions["--model"]) in given:
            from_file = _without_option(from_file, "--model")
        else:
            from_file = [FILE_MODEL + a[len("--model"):] if a == "--model" or a.startswith(
                "--model=") else a for a in from_file]
    return [*args[:first], *from_file, *args[first:]]


def config_paths(args: Sequence[str]) -> list[str]:
    """The files ``args`` names with ``--config FILE`` or ``--config=FILE``."""
    paths = [a[len(_CONFIG) + 1:] for a in args if a.startswith(_CONFIG + "=")]
    return paths + [args[i + 1] for i, a in enumerate(args[:-1]) if a == _CONFIG]


def flags_with_config(parser: argparse.ArgumentParser, argv: Sequence[str],
                      flags_of: Callable[[list[str]], dict[str, str]]) -> dict[str, str]:
    """``flags_of``'s field -> flag map for a subcommand's ``argv``, with its ``--config``
    file's options too: a field only the file set is named with the file (``--max-num-seqs in
    serve.yaml``), for a one-line error that names the field."""
    typed = dashed(argv)
    on_line = flags_of(typed)
    paths = config_paths(typed)
    if not paths:
        return on_line
    try:
        expanded = expand_config(parser, typed)
    except ValueError:  # the file's own mistake was named already
        return on_line
    return {field: flag if field in on_line else f"{flag} in {paths[0]}"
            for field, flag in flags_of(expanded).items()}


def dashed(argv: Sequence[str]) -> list[str]:
    """``argv`` with underscores in option names turned into dashes (vLLM's parser takes
    ``--max_model_len`` for ``--max-model-len`` in every command); values, positionals and
    whatever follows ``--`` as they are."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            return out + list(argv[i:])
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            option, dot, path = name.partition(".")  # a dotted key keeps its own spelling
            arg = option.replace("_", "-") + dot + path + eq + value
        out.append(arg)
    return out


def _folded(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """vLLM's dotted options: ``--hf-overrides.rope_theta 1e6`` (or ``=1e6``) for
    ``--hf-overrides '{"rope_theta": 1e6}'``, keys nesting at each dot, each value read as
    JSON where it is JSON, else as a string; several of one option make one object, given
    where its first one was. For the options that take a JSON object only."""
    actions = parser._option_string_actions  # argparse has no public lookup
    out: list[str] = []
    objects: dict[str, dict[str, Any]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out += args[i:]
            break
        name, eq, value = arg.partition("=")
        option, _, path = name.partition(".")
        action = actions.get(option) if arg.startswith("--") and path else None
        if action is None or action.type not in (json_object, json_object_or_int):
            out.append(arg)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):  # the next option's
                raise ValueError(f"{name} needs a value.")
            value, i = args[i + 1], i + 1
        if option not in objects:
            if any(a == option or a.startswith(option + "=") for a in args):
                raise ValueError(f"{option} given both whole and with dotted keys ({name}); "
                                 f"give one or the other.")
            objects[option] = {}
            out += [option, ""]  # its JSON, once every key is in
        node = objects[option]
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ValueError(f"{name}: {key} is given a value and keys.")
        if isinstance(node.get(last), dict):
            raise ValueError(f"{name}: {last} is given keys and a value.")
        node[last] = _json_or_text(value)
        i += 1
    for option, value in objects.items():
        out[out.index(option) + 1] = json.dumps(value)
    return out


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _normalized(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``argv`` with underscores in option names turned into dashes, and an abbreviation of
    ``--config`` that argparse would take for it (a prefix of no other option) written out, so
    that its file is read rather than silently ignored."""
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    out: list[str] = []
    args = dashed(argv)
    for i, arg in enumerate(args):
        if arg == "--":  # everything after it is positional
            return out + args[i:]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if (len(name) > 2 and name != _CONFIG and _CONFIG.startswith(name)
                    and [o for o in options if o.startswith(name)] == [_CONFIG]):
                name = _CONFIG
            arg = name + eq + value
        out.append(arg)
    return out


def _file_args(parser: argparse.ArgumentParser, path: str, given: set[int]) -> list[str]:
    import yaml

    where = f"{_CONFIG} {path}"
    if Path(path).suffix not in (".yaml", ".yml"):
        raise ValueError(f"{where}: the config file must be YAML (.yaml or .yml).")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ValueError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: not UTF-8 text (byte {exc.start}: {exc.reason}).") from None
    except yaml.YAMLError as exc:
        problem = str(getattr(exc, "problem", None) or exc).splitlines()[0]
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise ValueError(f"{where}: not valid YAML{line}: {problem}") from None
    if data is None:
        return []
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of option names to values, "
                         f"got a {type(data).__name__}.")
    actions = parser._option_string_actions  # argparse has no public lookup
    out: list[str] = []
    for key, value in data.items():
        option = "--" + str(key).lstrip("-").replace("_", "-")
        action = actions.get(option)
        if action is None or option in (_CONFIG, "--help") or not action.option_strings:
            raise ValueError(f"{where}: unknown option {key!r} (not a flag of {parser.prog}).")
        if isinstance(action, argparse._AppendAction) and id(action) in given:
            continue
        if value is not None:
            out += _option_args(actions, action, option, value, f"{where}: {key}")
    return out


def _option_args(
    actions: dict[str, argparse.Action], action: argparse.Action, option: str, value: Any,
    where: str,
) -> list[str]:  # fmt: skip
    if action.nargs == 0:  # a switch
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}.")
        if value:
            return [option]
        name = option[2:]
        opposite = "--" + name[3:] if name.startswith("no-") else "--no-" + name
        return [opposite] if opposite in actions else []
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [f"{option}={_checked(action, _text(item, where), where)}" for item in items]
    if (isinstance(value, list) and action.type is json_string_list
            or isinstance(value, dict) and action.type in (json_object, json_object_or_int)):
        try:
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:  # a YAML date, .nan
            raise ValueError(f"{where}: expected JSON values only ({exc}).") from None
        return [f"{option}={_checked(action, text, where)}"]
    if isinstance(value, list) and action.nargs in ("+", "*"):
        if not value and action.nargs == "+":
            raise ValueError(f"{where}: expected at least one value, got [].")
        items = [_checked(action, _text(item, where), where) for item in value]
        dashed = next((item for item in items if item.startswith("-")), None)
        if dashed is not None:  # argparse would read it as an option
            raise ValueError(f"{where}: a list item may not start with '-', got {dashed!r}.")
        return [option, *items]
    if isinstance(value, (list, dict)):
        raise ValueError(f"{where}: expected a single value, got {value!r}.")
    return [f"{option}={_checked(action, _text(value, where), where)}"]


def _text(value: Any, where: str) -> str:
    if isinstance(value, (list, dict)):
        raise ValueError(f"{where}: expected a single value, got {value!r}.")
    if value is None:  # only a list item gets here: a top-level null leaves the default
        raise ValueError(f"{where}: a list item may not be null.")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _checked(action: argparse.Action, text: str, where: str) -> str:
    """``text`` after checking it as argparse would (type and choices)."""
    try:
        value = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: invalid value {text!r} ({exc}).") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ValueError(f"{where}: invalid choice {text!r} (choose from {choices}).")
    return text


def _without_option(args: list[str], option: str) -> list[str]:
    """``args`` without ``option`` (``--x V`` or ``--x=V``)."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out
