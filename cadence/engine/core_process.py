"""The engine core in a process of its own (opt-in: ``EngineArgs(engine_process=True)``,
``cadence serve --engine-process``), and the front end's client of it.

In the default mode the engine core thread and the server's event loop share one interpreter
lock: at a few hundred streams both want it most of the time. Here a child process runs the same
``EngineCoreProc`` loop (``core_host``) and each front end talks to it over a pair of pipes (a
``CoreChannel``). A reader thread in the front end turns what arrives into the same output queue
the threaded client has, so ``AsyncLLM`` works unchanged.

``start_core_process(args, n)`` starts a core for ``n`` front ends (``cadence serve
--api-server-count n``: several API server processes over one engine) and waits until it is
ready; ``ProcessEngineCoreClient.spawn(args)`` is the one-front-end case, where the client owns
the process.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import pickle
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from cadence.core_types import EngineCoreOutputs, EngineCoreRequest
from cadence.engine.core_client import EngineCoreClient
from cadence.engine.core_host import CoreFacts, HostChannel, host_main
from cadence.engine.core_proc import (
    EngineDead,
    EngineDeadError,
    OutputQueue,
    fail_future,
    resolve_future,
)
from cadence.engine.engine_args import EngineArgs

__all__ = ["CoreChannel", "CoreFacts", "ProcessEngineCoreClient", "start_core_process"]

logger = logging.getLogger(__name__)


@dataclass
class CoreChannel:
    """A front end's ends of its pipes to the engine-core process (picklable: a launcher hands
    it to the front-end process that will use it)."""

    requests: Connection  # sends
    replies: Connection  # receives


def start_core_process(
    args: EngineArgs, num_clients: int = 1, *, startup_timeout: float | None = None
) -> tuple[BaseProcess, list[CoreChannel], CoreFacts]:
    """Spawn the engine-core process for ``num_clients`` front ends and wait until it is ready.

    Raises the core's own start-up error (e.g. a bad model path), or ``TimeoutError``."""
    ctx = multiprocessing.get_context("spawn")  # the child owns its CUDA context
    host_ends, channels = [], []
    for _ in range(num_clients):
        req_recv, req_send = ctx.Pipe(duplex=False)
        rep_recv, rep_send = ctx.Pipe(duplex=False)
        host_ends.append(HostChannel(req_recv, rep_send))
        channels.append(CoreChannel(req_send, rep_recv))
    process = ctx.Process(target=host_main, args=(args, host_ends), name="cadence-engine-core",
                          daemon=True)
    process.start()
    for h in host_ends:  # only the child uses these now
        h.requests.close()
        h.replies.close()
    facts: CoreFacts | None = None
    try:
        for ch in channels:
            if startup_timeout is not None and not ch.replies.poll(startup_timeout):
                raise TimeoutError(f"the engine core did not start within {startup_timeout} s")
            try:
                kind, payload = ch.replies.recv()
            except EOFError:
                process.join(10)
                raise RuntimeError(
                    f"the engine core process exited during start-up (code {process.exitcode})"
                ) from None
            if kind == "startup_error":
                process.join(10)
                raise payload
            facts = payload
    except BaseException:
        if process.is_alive():
            process.kill()
            process.join(5)
        raise
    assert facts is not None
    return process, channels, facts


class ProcessEngineCoreClient(EngineCoreClient):
    """An engine core in a child process (spawned, so that it owns its CUDA context)."""

    def __init__(self, channel: CoreChannel, facts: CoreFacts,
                 process: BaseProcess | None = None) -> None:
        """A client over ``channel``; ``process`` is the core's process when this client owns
        it (stops it on ``shutdown``), None when a launcher does (``shutdown`` only leaves)."""
        self._requests = channel.requests
        self._replies = channel.replies
        self.process = process
        self.facts = facts
        self._send_lock = threading.Lock()
        self._outputs = OutputQueue()
        self._calls: dict[int, Future[Any]] = {}
        self._call_ids = itertools.count()
        self._dead_error: EngineDeadError | None = None
        self._live: set[str] = set()
        self._progress = time.monotonic()
        self._reader = threading.Thread(target=self._read, name="cadence-core-reader",
                                        daemon=True)
        self._reader.start()

    @classmethod
    def spawn(cls, args: EngineArgs, *, startup_timeout: float | None = None
              ) -> ProcessEngineCoreClient:
        """Start an engine-core process of this client's own."""
        process, (channel,), facts = start_core_process(args, 1, startup_timeout=startup_timeout)
        return cls(channel, facts, process)

    # -- front end -> core -------------------------------------------------------------------
    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            with self._send_lock:
                self._requests.send(message)
        except (OSError, ValueError) as exc:  # the pipe is closed: the core is gone
            raise self._dead_error or EngineDeadError("The engine core process is gone.") from exc

    def _check_alive(self) -> None:
        if self.errored:
            raise self._dead_error or EngineDeadError()

    def add_request(self, request: EngineCoreRequest) -> None:
        self._check_alive()
        if not self._live:
            self._progress = time.monotonic()  # the core wakes up to new work
        self._live.add(request.request_id)
        self._send(("add", request))

    def abort_requests(self, request_ids: list[str]) -> None:
        # Aborts are idempotent and harmless after death: never raise here (cleanup paths).
        if request_ids and not self.errored:
            self._live.difference_update(request_ids)
            try:
                self._send(("abort", list(request_ids)))
            except EngineDeadError:
                pass

    def _submit_utility(self, method: str, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> Future[Any]:
        self._check_alive()
        fut: Future[Any] = Future()
        call_id = next(self._call_ids)
        self._calls[call_id] = fut
        try:
            self._send(("utility", call_id, method, args, kwargs))
        except EngineDeadError as exc:
            self._calls.pop(call_id, None)
            fail_future(fut, exc)
        return fut

    # -- core -> front end -------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            try:
                message = self._replies.recv()
            except (EOFError, OSError):
                if self._dead_error is None and self.process is not None:
                    self.process.join(1)  # its exit code, for the message
                code = self.process.exitcode if self.process is not None else "unknown"
                self._die(f"The engine core process exited (code {code}).")
                return
            except Exception as exc:  # a message this process cannot rebuild: no one reads on
                self._die(f"A message from the engine core could not be read: {exc!r}")
                return
            kind = message[0]
            if kind == "out":
                outputs: EngineCoreOutputs = message[1]
                self._progress = time.monotonic()
                if outputs.finished_requests:
                    self._live.difference_update(outputs.finished_requests)
                self.output_queue.put(outputs)
            elif kind == "reply":
                _, call_id, ok, data = message
                fut = self._calls.pop(call_id, None)
                if fut is not None:
                    try:
                        value = pickle.loads(data)
                    except Exception as exc:  # e.g. a class this process cannot import
                        ok, value = False, RuntimeError(
                            f"the engine core's reply cannot be rebuilt here: {exc!r}")
                    # NOTE: the caller may cancel the future at any moment (a bounded wait).
                    resolve_future(fut, value) if ok else fail_future(fut, value)
            elif kind == "dead":
                self._die(message[1])
                return

    def _die(self, message: str) -> None:
        if self._dead_error is None:
            self._dead_error = EngineDeadError(message)
        for fut in list(self._calls.values()):
            fail_future(fut, self._dead_error)
        self._calls.clear()
        self.output_queue.put(EngineDead(self._dead_error))

    @property
    def output_queue(self) -> OutputQueue:
        return self._outputs

    def _unwrap(self, item: Any) -> EngineCoreOutputs:
        if isinstance(item, EngineCoreOutputs):
            return item
        self.output_queue.put(item)  # every later reader sees the death too
        raise self._dead_error or EngineDeadError()

    # -- state -------------------------------------------------------------------------------
    @property
    def errored(self) -> bool:
        if self._dead_error is not None:
            return True
        return self.process is not None and not self.process.is_alive()

    @property
    def last_progress_time(self) -> float:
        return self._progress

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Ask the core process to stop, then join it (killed if it does not stop in time).
        A client that does not own the process only leaves: the core aborts its requests."""
        if self.process is not None and self.process.is_alive():
            try:
                self._send(("shutdown",))
            except EngineDeadError:
                pass
            self.process.join(timeout)
            if self.process.is_alive():
                logger.warning("The engine core process did not stop within %s s.", timeout)
                self.process.kill()
                self.process.join(5)
        if self._dead_error is None:
            self._dead_error = EngineDeadError("The engine core was shut down.")
        self._requests.close()
