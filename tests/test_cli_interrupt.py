"""Ctrl-C while a command starts: one line and exit status 130, even where a library took the
interrupt inside an import and failed afterwards on its half-made modules."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cadence import cli
from tests.child_env import child_env

ROOT = Path(__file__).resolve().parents[1]

# Run as a terminal's foreground job runs it: SIGINT at Python's default handler (a background
# job of a non-interactive shell inherits it ignored, and then it is left ignored).
_PROLOGUE = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import cadence.cli as cli
"""

_SWALLOWED = """
import cadence.engine.llm as llm
def load(self, *args, **kwargs):
    try:
        signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
        pass  # as torch's lazy import takes it: a failed import
    raise RuntimeError("partially initialized module 'half' has no attribute 'made'")
llm.LLM.__init__ = load
sys.exit(cli.main(["generate", "--model", "tiny", "--prompt", "x"]))
"""

# A user error (a ValueError) after the interrupt: still the interruption's one line.
_SWALLOWED_USER_ERROR = _SWALLOWED.replace("RuntimeError", "ValueError")

_WHILE_PARSING = """
build = cli.build_parser
def build_parser():
    signal.raise_signal(signal.SIGINT)
    return build()
cli.build_parser = build_parser
sys.exit(cli.main(["bench", "latency", "--model", "tiny"]))
"""

_UNINTERRUPTED_FAILURE = """
import cadence.engine.llm as llm
def load(self, *args, **kwargs):
    raise RuntimeError("a real bug")
llm.LLM.__init__ = load
sys.exit(cli.main(["generate", "--model", "tiny", "--prompt", "x"]))
"""


def _run(body: str) -> subprocess.CompletedProcess:
    env = child_env(OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", _PROLOGUE + body], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("body", "line"), [
    (_SWALLOWED, "cadence generate: interrupted"),
    (_SWALLOWED_USER_ERROR, "cadence generate: interrupted"),
    (_WHILE_PARSING, "cadence bench latency: interrupted"),
], ids=["swallowed-then-failed", "swallowed-then-user-error", "while-parsing"])
def test_an_interrupt_ends_the_command_in_one_line(body: str, line: str) -> None:
    done = _run(body)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines() == [line], done.stderr


def test_a_failure_without_an_interrupt_keeps_its_traceback() -> None:
    done = _run(_UNINTERRUPTED_FAILURE)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "RuntimeError: a real bug" in done.stderr
    assert "interrupted" not in done.stderr


@pytest.fixture
def default_sigint():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_the_handler_is_taken_and_given_back(default_sigint) -> None:
    interrupt = cli._Interrupt()
    previous = interrupt.install()
    assert signal.getsignal(signal.SIGINT) is interrupt and not interrupt.seen
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert interrupt.seen
    interrupt.uninstall(previous)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_sigint_stays_ignored(default_sigint) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    interrupt = cli._Interrupt()
    assert interrupt.install() is None
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_off_the_main_thread_nothing_is_taken(default_sigint) -> None:
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(cli._Interrupt().install()))
    thread.start()
    thread.join()
    assert got == [None] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_main_gives_sigint_back(default_sigint, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
