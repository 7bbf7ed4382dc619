"""User mistakes on the command line end in one line on stderr and exit status 2.

A configuration mistake (a missing model path, an out-of-range flag, a preset without
``--load-format dummy``, CUDA asked for where there is none) surfaces as one of
``USER_ERRORS`` while the command starts; its message already says what is wrong and what to do,
so a traceback only hides it. Tracebacks stay for everything else (real bugs), and for these too
with ``CADENCE_LOG_LEVEL=DEBUG``.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from cadence.envs import read_envs

__all__ = ["USAGE_EXIT_CODE", "USER_ERRORS", "ArgumentParser", "first_line", "name_the_flag",
           "one_line_errors"]

USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError,
)
USAGE_EXIT_CODE = 2  # as argparse


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose own mistakes (an unknown flag, a bad value or choice) end in one
    line too: argparse prints its whole usage first, for ``serve`` some sixty lines above the
    one that says what is wrong. Also vLLM's ``--help=KEYWORD``: the help of the options whose
    name holds the keyword (``--help=all``: all of it), and its optional values: ``None`` or
    ``""`` for an option whose default is None."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT_CODE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # vLLM's optional values: "None" or "" given to an option whose default is None is
        # that default (command lines written for vLLM, e.g. by templates, pass them).
        if (action.option_strings and action.default is None and action.nargs is None
                and arg_strings in (["None"], [""])):
            return None
        return super()._get_values(action, arg_strings)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        given = list(sys.argv[1:] if args is None else args)
        # A command's own parser only: not one handing its arguments on (subcommands, or a
        # positional that takes the rest, as ``bench WHICH ...``).
        leaf = not any(isinstance(a, argparse._SubParsersAction) or a.nargs == argparse.REMAINDER
                       for a in self._actions)
        for arg in given if leaf else ():  # a command's own parser: after the subcommand
            if arg == "--":
                break
            if arg.startswith("--help="):
                self._help_for(arg.partition("=")[2])
        return super().parse_known_args(args, namespace)

    def _help_for(self, keyword: str) -> NoReturn:
        if keyword.lower() == "all":
            self.print_help()
            self.exit(0)
        key = keyword.strip().lstrip("-").replace("_", "-").lower()
        found = [a for a in self._actions if key and a.help is not argparse.SUPPRESS and any(
            key in o.lstrip("-").lower() for o in a.option_strings)]
        if not found:
            self.error(f"no option's name holds {keyword!r} (--help=all lists every option)")
        formatter = self._get_formatter()
        formatter.start_section(f"options matching {keyword!r}")
        formatter.add_arguments(found)
        formatter.end_section()
        self._print_message(formatter.format_help(), sys.stdout)
        self.exit(0)


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (a library's error often runs on), or its type's
    name where it has none: what a one-line error quotes of a library's failure. A first line
    that only announces what follows ("Validation error for field 'x':") takes the next one,
    which holds the reason."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def flags_given(parser: argparse.ArgumentParser, argv: Sequence[str]) -> dict[str, str]:
    """Each of ``parser``'s destinations that ``argv`` sets -> the flag spelling used there
    (``port``: ``--port``), for ``name_the_flag``. Destinations no given flag set are left out:
    their errors are not a flag's."""
    given = {a.partition("=")[0] for a in argv if a.startswith("-")}
    flags: dict[str, str] = {}
    for action in parser._actions:
        used = [o for o in action.option_strings if o in given]
        if used:
            flags[action.dest] = used[0]
    return flags


def name_the_flag(message: str, flags: Mapping[str, str]) -> str:
    """A configuration's error names its field (``max_num_seqs must be ...``, as the Python API
    is given it); on a command line the flag that set it is put first (``--max-num-seqs:``).
    ``flags``: field -> flag."""
    field = re.match(r"[A-Za-z_]\w*", message)
    flag = flags.get(field.group()) if field else None
    return f"{flag}: {message}" if flag else message


@contextmanager
def one_line_errors(prog: str, interrupted: Callable[[], bool] | None = None,
                    flags: Callable[[], Mapping[str, str]] | None = None) -> Iterator[None]:
    """Turn a user mistake raised inside into ``prog: error: MESSAGE`` and exit status 2.
    ``interrupted``: whether Ctrl-C came first, which makes the error its consequence (a
    library's half-made state), left to the caller's one line for the interruption.
    ``flags``: the command's config field -> flag map (``name_the_flag``), made on an error."""
    try:
        yield
    except USER_ERRORS as exc:
        if read_envs().logging_level <= logging.DEBUG or (interrupted and interrupted()):
            raise
        message = str(exc) or type(exc).__name__
        if flags is not None:
            message = name_the_flag(message, flags())
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(USAGE_EXIT_CODE) from None
