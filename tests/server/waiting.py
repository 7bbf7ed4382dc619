"""Waiting on server-side conditions (with a safety bound), and reading /metrics."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

from tests.child_env import child_env

T = TypeVar("T")


def wait_until(
    check: Callable[[], T], what: str, timeout: float = 20.0, interval: float = 0.01
) -> T:
    """Poll ``check`` every ``interval`` seconds until it returns something truthy; fail after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus exposition (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def scrape(http: httpx.Client) -> str:
    resp = http.get("/metrics")
    assert resp.status_code == 200
    return resp.text


def spawn_serve(args: list[str], log: Path, *, new_session: bool = False) -> subprocess.Popen:
    """``cadence serve ARGS`` as a subprocess of this checkout, its output in ``log``; with
    ``new_session`` it leads its own process group (for signals to the whole group)."""
    env = child_env(OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "cadence", "serve", *args]
    with open(log, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=new_session)


def answers_health(proc: subprocess.Popen, base: str, log: Path) -> bool:
    """Whether the server at ``base`` answers /health with 200; fails with the log when the
    process has already exited."""
    assert proc.poll() is None, log.read_text()
    try:
        return httpx.get(base + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class ServeProcess:
    """``cadence serve ARGS`` as a real subprocess on a free port, logging to ``log``; the
    context waits until /health answers 200 and, on exit, sends SIGINT and keeps the exit
    status (``returncode``) and the log's text (``text``)."""

    def __init__(self, args: list[str], log: Path, start_timeout: float = 120.0) -> None:
        from tests.server.conftest import free_port

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.log = log
        self.start_timeout = start_timeout
        self.returncode: int | None = None
        self.text = ""

    def __enter__(self) -> ServeProcess:
        self.proc = spawn_serve([*self.args, "--port", str(self.port)], self.log)
        wait_until(lambda: answers_health(self.proc, self.base, self.log), "the server to start",
                   timeout=self.start_timeout, interval=0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.returncode = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.text = self.log.read_text()


def wait_released(engine) -> None:
    """Wait until ``engine`` (an AsyncLLM) has no open request and runs or queues nothing, then
    check that every usable KV block is free again."""
    wait_until(lambda: not engine.output_processor.has_unfinished_requests(), "no open request")

    def idle() -> bool:
        stats = engine.engine_core.call_utility("make_stats")
        return (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)

    wait_until(idle, "an idle engine")
    core = engine.engine_core.proc.engine_core
    assert core.num_free_kv_blocks == core.num_kv_blocks - 1
