"""Running the application under uvicorn: signals, graceful shutdown, and exiting on engine death.

- SIGINT and SIGTERM alike start a graceful shutdown: no new connections, new requests on open
  ones get 503, in-flight requests run for up to ``shutdown_timeout`` seconds, then each one
  still running ends with an error (SSE error event + ``[DONE]``, or a 503 JSON body). The
  process then exits 0. A second signal ends the in-flight requests at once (signals less
  than ``SAME_STOP_S`` apart are one stop).
- When the engine dies, the server answers 503 for ``engine_death_grace`` seconds and then shuts
  down with exit status 1, so that a supervisor restarts it (as vLLM's server does).
- The engine watchdog is polled every tick (0.1 s) so that a stall is logged when it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

from cadence.server.app import build_app
from cadence.server.http_protocol import timed_h11_protocol
from cadence.server.middleware import wrap_app
from cadence.server.settings import ServerSettings

if TYPE_CHECKING:
    from cadence.engine.async_llm import AsyncLLM
    from cadence.server.lifecycle import RequestLifecycle
    from cadence.server.watchdog import EngineWatchdog

__all__ = ["SAME_STOP_S", "CadenceServer", "StopFlag", "bind_socket", "build_server"]

logger = logging.getLogger("cadence.serve")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# uvicorn's own deadline for open connections, past ours: it cancels tasks (with tracebacks),
# which must never be needed.
_UVICORN_BACKSTOP_S = 5.0
# How long responses ended by the deadline get to write their last frames.
_LAST_WORDS_S = 3.0
# Stop signals this close together are one stop: ``timeout`` (and some supervisors) signal a
# process and then its whole process group, which holds it too.
SAME_STOP_S = 0.25


class StopFlag:
    """A stop asked for by a signal handler before the server took its signals over. A plain
    attribute, no lock: an ``Event``'s lock, taken again by a second signal that arrives
    inside ``set()``, would deadlock the main thread."""

    __slots__ = ("requested",)

    def __init__(self) -> None:
        self.requested = False


class CadenceServer(uvicorn.Server):
    """A uvicorn server that drains requests on shutdown and exits when the engine dies."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        lifecycle: RequestLifecycle,
        watchdog: EngineWatchdog,
        settings: ServerSettings,
        signals: tuple[int, ...] = _SIGNALS,
    ) -> None:
        super().__init__(config)
        self.signals = signals
        self.lifecycle = lifecycle
        self.watchdog = watchdog
        self.settings = settings
        # 0 after a shutdown asked for (signal, should_exit), 1 after the engine died.
        self.exit_code = 0
        # Set by a signal that arrived before this server took its signals over (a launcher's
        # process starting up): honoured at the first tick.
        self.stop_requested: StopFlag | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit_at: float | None = None
        self._first_stop_at = -float("inf")

    @property
    def exit_deadline(self) -> float | None:
        """When (``time.monotonic()``) the server exits after its engine died: the death was
        noticed ``engine_death_grace`` seconds before. None while the engine lives."""
        return self._exit_at

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        # NOTE: before the first request: with several API servers, front end 0 may never get
        # one, yet it must hear every step (it records the engine-wide metrics).
        self.watchdog.engine.start_output_handler()
        await super().startup(sockets)

    # -- signals -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises the captured signal after serving, which turns SIGTERM into death
        # by signal; a finished graceful shutdown is a normal exit here.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in self.signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # SIGUSR1: an API server's stop order from its launcher (server/api_servers.py)
        name = "the launcher's stop" if sig == signal.SIGUSR1 else signal.Signals(sig).name
        now = time.monotonic()
        if self.should_exit and now - self._first_stop_at < SAME_STOP_S:
            return  # the same stop, delivered to this process and to its process group
        if not self.should_exit:
            self._first_stop_at = now
            logger.info(
                "Received %s: shutting down; in-flight requests get up to %g s to finish.",
                name,
                self.settings.shutdown_timeout,
            )
        else:
            logger.warning("Received %s during shutdown: ending the in-flight requests now.", name)
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self.lifecycle.end_in_flight)
        super().handle_exit(sig, frame)

    # -- engine health -----------------------------------------------------------------------
    async def on_tick(self, counter: int) -> bool:
        early = self.stop_requested
        if early is not None and early.requested and not self.should_exit:
            early.requested = False
            self.handle_exit(signal.SIGTERM, None)
        should_exit = await super().on_tick(counter)
        self.watchdog.problem()  # logs a stall (or a recovery) as it happens
        if self.watchdog.dead and self._exit_at is None:
            grace = self.settings.engine_death_grace
            logger.error(
                "The engine died: exiting with status 1 in %g s so that a supervisor restarts "
                "the server.",
                grace,
            )
            self.exit_code = 1
            self._exit_at = time.monotonic() + grace
        if self._exit_at is not None and time.monotonic() >= self._exit_at:
            return True
        return should_exit

    # -- shutdown ----------------------------------------------------------------------------
    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.lifecycle.stop_accepting()
        deadline = asyncio.ensure_future(self._end_in_flight_after(self.settings.shutdown_timeout))
        try:
            await super().shutdown(sockets)
        finally:
            self.lifecycle.end_in_flight()  # whatever is left (a forced exit)
            await self.lifecycle.wait_idle(_LAST_WORDS_S)
            deadline.cancel()

    async def _end_in_flight_after(self, timeout: float) -> None:
        if await self.lifecycle.wait_idle(timeout):
            return
        logger.warning(
            "Shutdown timeout of %g s reached: ending %d in-flight request(s) with an error.",
            timeout,
            self.lifecycle.in_flight,
        )
        self.lifecycle.end_in_flight()


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything slow starts (a taken port is a one-line
    error at once, not after the model has loaded). ``ValueError`` if it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def http_protocol(kind: str, header_read_timeout: float, body_read_timeout: float) -> type:
    """The connection protocol class for ``kind`` ("auto": httptools when installed, the faster
    parser and writer of the two, else h11), with the read deadlines."""
    if kind == "auto":
        kind = "httptools" if importlib.util.find_spec("httptools") is not None else "h11"
    if kind == "httptools":
        from cadence.server.http_protocol_httptools import timed_httptools_protocol

        return timed_httptools_protocol(header_read_timeout, body_read_timeout)
    return timed_h11_protocol(header_read_timeout, body_read_timeout)


def build_server(
    engine: AsyncLLM,
    settings: ServerSettings,
    *,
    served_model_name: str | Sequence[str] | None = None,
    api_key: str | Sequence[str] | None = None,
    signals: tuple[int, ...] = _SIGNALS,
    front_end_index: int | None = None,
    chat_template: str | None = None,
) -> CadenceServer:
    """The server for ``engine``: run it with ``.run()`` (or ``await .serve()``); the caller
    shuts the engine down afterwards. ``.exit_code`` is the process status to exit with.
    ``signals`` start a graceful shutdown (SIGINT and SIGTERM)."""
    app = build_app(
        engine,
        served_model_name=served_model_name,
        api_key=api_key,
        max_request_body_bytes=settings.max_request_body_bytes,
        body_read_timeout=settings.body_read_timeout,
        engine_stall_timeout=settings.engine_stall_timeout,
        front_end_index=front_end_index,
        chat_template=chat_template,
        web_page=settings.web_page,
        reasoning_parser=settings.reasoning_parser,
        tool_call_parser=settings.tool_call_parser if settings.enable_auto_tool_choice else None,
        trust_request_chat_template=settings.trust_request_chat_template,
        responses=settings.responses,
        chat_template_content_format=settings.chat_template_content_format,
        default_chat_template_kwargs=settings.default_chat_template_kwargs,
    )
    config = uvicorn.Config(
        wrap_app(app, settings),
        host=settings.host,
        port=settings.port,
        http=http_protocol(
            settings.http, settings.header_read_timeout, settings.body_read_timeout
        ),
        timeout_keep_alive=settings.timeout_keep_alive,  # type: ignore[arg-type]
        timeout_graceful_shutdown=settings.shutdown_timeout + _UVICORN_BACKSTOP_S,  # type: ignore[arg-type]
        log_level=settings.uvicorn_log_level,
        access_log=not settings.disable_uvicorn_access_log,
        ssl_keyfile=settings.ssl_keyfile,
        ssl_certfile=settings.ssl_certfile,
        lifespan="off",
    )
    server = app.state.server
    return CadenceServer(
        config, lifecycle=server.lifecycle, watchdog=server.watchdog, settings=settings,
        signals=signals,
    )
