"""Several API server processes over one engine-core process (``cadence serve
--api-server-count N``, as vLLM's ``--api-server-count``).

At hundreds of streams one event loop spends its interpreter on HTTP, output processing and SSE
frames for every token of every stream. Here the launcher (this process) binds the listening
socket, starts the engine core in a process of its own for ``N`` front ends, then starts ``N``
front-end processes that all accept on that one socket (the kernel hands each new connection to
one of them). Each front end is a whole server (``AsyncLLM`` over a ``ProcessEngineCoreClient``
of its own, the OpenAI app, uvicorn); the core routes each request's outputs back to the front end
that sent it.

Signals: SIGINT or SIGTERM to the launcher becomes SIGUSR1 to every front end (each drains its
requests as a single server does; a second signal ends them at once); the front ends ignore
SIGINT and SIGTERM, so a terminal's Ctrl-C or a SIGTERM to the whole process group (systemd's
stop, ``kill -- -PGID``) counts once: only the launcher's forward reaches them. When every
front end has exited, the core (whose pipes are then all closed) stops. The launcher exits 0
after a requested shutdown, 1 when the engine or a front end died.

``/metrics`` on any front end sums every front end's values (prometheus_client's multiprocess
mode over a temporary directory that the launcher owns); front end 0 records the engine-wide
gauges and counters.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from types import FrameType
from typing import Any

from cadence.engine.core_process import CoreChannel, CoreFacts, start_core_process
from cadence.engine.engine_args import EngineArgs
from cadence.server.launcher import SAME_STOP_S, StopFlag, bind_socket
from cadence.server.settings import ServerSettings

__all__ = ["FrontEndOptions", "run_api_servers"]

logger = logging.getLogger("cadence.serve")

# The launcher's stop order to its API servers: a signal nothing else sends them.
STOP_SIGNAL = signal.SIGUSR1

_METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own switch
# After the front ends, how long the core gets to stop by itself before it is killed.
_CORE_EXIT_TIMEOUT_S = 15.0
# An API server asked to stop exits within its shutdown_timeout plus uvicorn's backstop, the
# last frames and its engine client's shutdown; past this margin too, it is killed.
_FRONT_END_EXIT_MARGIN_S = 20.0


@dataclass(frozen=True)
class FrontEndOptions:
    """What each front-end process needs besides its channel (picklable)."""

    settings: ServerSettings
    served_model_name: list[str] | None
    api_key: tuple[str, ...]
    log_level: str
    log_requests: bool
    chat_template: str | None = None
    max_log_len: int | None = None


def _stop_when_orphaned(launcher: int, stopping: Callable[[], bool],
                        interval: float = 1.0) -> threading.Thread:
    """Send this process its stop signal (its graceful stop) once ``launcher``, the process
    that started it, is gone: a launcher killed outright (SIGKILL) cannot stop its API servers,
    which would serve on, on its port, with no one to stop them. Not when ``stopping()`` already
    (a second signal would end the drain's in-flight requests at once)."""

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(interval)
        if stopping():
            return
        logger.warning("The launcher (pid %d) is gone: stopping this API server.", launcher)
        os.kill(os.getpid(), STOP_SIGNAL)

    thread = threading.Thread(target=watch, name="cadence-launcher-watch", daemon=True)
    thread.start()
    return thread


def _front_end_main(
    index: int, channel: CoreChannel, facts: CoreFacts, args: EngineArgs,
    options: FrontEndOptions, sock: socket.socket, launcher: int,
) -> None:  # fmt: skip
    """One API server process: a whole server over its channel to the shared engine core."""
    from cadence.engine.async_llm import AsyncLLM
    from cadence.engine.core_process import ProcessEngineCoreClient
    from cadence.server.launcher import build_server

    # NOTE: Ctrl-C and a SIGTERM to the process group reach the launcher too, which forwards
    # them once as STOP_SIGNAL: taken here as well, they would count twice (the second ends
    # the drain at once).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A stop before the server takes its signals over (while the model's tokenizer loads)
    # must still become a graceful stop, not death by signal.
    early = StopFlag()
    signal.signal(STOP_SIGNAL, lambda sig, frame: setattr(early, "requested", True))
    servers: list[Any] = []  # the server, once built
    _stop_when_orphaned(launcher, lambda: early.requested
                        or any(getattr(s, "should_exit", False) for s in servers))
    logging.basicConfig(format=f"%(asctime)s %(levelname)s %(name)s[{index}]: %(message)s")
    logging.getLogger().setLevel(options.log_level.upper())
    engine = AsyncLLM(args, log_requests=options.log_requests,
                      core_client=ProcessEngineCoreClient(channel, facts),
                      max_log_len=options.max_log_len)
    try:
        server = build_server(
            engine,
            options.settings,
            served_model_name=options.served_model_name,
            chat_template=options.chat_template,
            api_key=options.api_key,
            signals=(STOP_SIGNAL,),
            front_end_index=index,
        )
        server.stop_requested = early
        servers.append(server)
        server.run(sockets=[sock])
        code = server.exit_code
    finally:
        engine.shutdown()  # leaves the core; the launcher stops it
    raise SystemExit(code)


class _Signals:
    """SIGINT / SIGTERM to the launcher: forwarded to the front ends as ``STOP_SIGNAL``."""

    def __init__(self, fronts: list[multiprocessing.process.BaseProcess]) -> None:
        self.fronts = fronts
        self.count = 0
        self.first_at = -float("inf")  # when the first stop came (time.monotonic())

    def __call__(self, sig: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.count and now - self.first_at < SAME_STOP_S:
            return  # the same stop, delivered to this process and to its process group
        self.count += 1
        if self.count == 1:
            self.first_at = now
            logger.info("Received %s: shutting down the API servers.", signal.Signals(sig).name)
        self.forward()

    def stop_all(self) -> None:
        """Stop every API server as a first signal would (one of them died)."""
        self.count, self.first_at = 1, time.monotonic()
        self.forward()

    def forward(self) -> None:
        for p in self.fronts:
            if p.is_alive() and p.pid is not None:
                try:
                    os.kill(p.pid, STOP_SIGNAL)
                except ProcessLookupError:
                    pass


def run_api_servers(args: EngineArgs, options: FrontEndOptions, count: int) -> int:
    """Serve with ``count`` API server processes until SIGINT/SIGTERM (status 0) or until the
    engine or a front end dies (status 1)."""
    settings = options.settings
    sock = bind_socket(settings.host, settings.port)  # a taken port fails before the model loads
    try:
        core, channels, facts = start_core_process(args, count)
    except BaseException:
        sock.close()
        raise
    # The front ends' Prometheus values, summed at each scrape (read by prometheus_client at
    # import in each front-end process, which inherits this environment).
    metrics_dir = tempfile.mkdtemp(prefix="cadence-metrics-")
    previous_dir = os.environ.get(_METRICS_DIR_ENV)
    os.environ[_METRICS_DIR_ENV] = metrics_dir
    ctx = multiprocessing.get_context("spawn")
    fronts = [
        ctx.Process(target=_front_end_main,
                    args=(i, channels[i], facts, args, options, sock, os.getpid()),
                    name=f"cadence-api-server-{i}")
        for i in range(count)
    ]  # fmt: skip
    handler = _Signals(fronts)
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    status = 0
    try:
        for p in fronts:
            p.start()
        for ch in channels:  # the front ends hold them now; the core sees EOF when they exit
            ch.requests.close()
            ch.replies.close()
        port = sock.getsockname()[1]
        sock.close()
        logger.info("Serving on %s://%s:%d%s with %d API server processes (pids %s) over the "
                    "engine-core process (pid %s); API key %s",
                    "https" if settings.ssl_certfile else "http", settings.host, port,
                    settings.root_path,
                    count, ", ".join(str(p.pid) for p in fronts), core.pid,
                    "required" if options.api_key else "not required")
        running = {p.sentinel: p for p in fronts}
        core_reported = False
        while running:
            timeout = None  # serving: no bound; stopping: the drain's, and then some
            if handler.count:
                timeout = max(0.0, handler.first_at + settings.shutdown_timeout
                              + _FRONT_END_EXIT_MARGIN_S - time.monotonic())
            ready = wait([*running, core.sentinel] if core.is_alive() else [*running], timeout)
            if not ready:
                logger.error("API server(s) %s did not stop within %g s of the stop: killing "
                             "them.", ", ".join(p.name for p in running.values()),
                             settings.shutdown_timeout + _FRONT_END_EXIT_MARGIN_S)
                status = 1
                break  # the finally below kills them
            # The core's end first: API servers that end with it are its consequence.
            for sentinel in sorted(ready, key=lambda s: s != core.sentinel):
                if sentinel == core.sentinel:
                    if not core_reported and handler.count == 0:
                        core.join(1)  # its exit code, for the message
                        code = core.exitcode
                        how = (f"signal {-code}" if code is not None and code < 0
                               else f"code {code}")
                        logger.error("The engine core process exited (%s); the API servers "
                                     "are stopping.", how)
                        status = 1
                    core_reported = True
                    continue
                p = running.pop(sentinel)
                p.join()
                if handler.count and p.exitcode in (-STOP_SIGNAL, -signal.SIGTERM):
                    # Our stop signal (or the group's SIGTERM) came before the process took the
                    # signal over (still starting) or after it let it go (already ending).
                    # Asked to stop, it stopped.
                    logger.info("API server %s stopped on the stop signal.", p.name)
                elif p.exitcode != 0:
                    status = 1
                    if core_reported:  # each stops by itself once the engine core is gone
                        logger.info("API server %s stopped (status %s).", p.name, p.exitcode)
                    elif handler.count == 0:
                        logger.error("API server %s exited with status %s: stopping the others.",
                                     p.name, p.exitcode)
                        handler.stop_all()
    finally:
        for sig, prev in previous.items():
            signal.signal(sig, prev)
        for p in fronts:
            if p.is_alive():
                p.kill()
                p.join(5)
        core.join(_CORE_EXIT_TIMEOUT_S)
        if core.is_alive():
            logger.warning("The engine core process did not stop: killing it.")
            core.kill()
            core.join(5)
        shutil.rmtree(metrics_dir, ignore_errors=True)
        if previous_dir is None:
            os.environ.pop(_METRICS_DIR_ENV, None)
        else:
            os.environ[_METRICS_DIR_ENV] = previous_dir
    return status
