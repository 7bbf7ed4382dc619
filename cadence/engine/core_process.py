"""The engine core in a process of its own (opt-in: ``EngineArgs(engine_process=True)``,
``cadence serve --engine-process``).

In the default mode the engine core thread and the server's event loop share one interpreter
lock: at a few hundred streams both want it most of the time. Here the child process runs the
same ``EngineCoreProc`` loop (through an ``InprocEngineCoreClient`` of its own) and the front end
talks to it over two pipes: requests, aborts and utility calls one way; step outputs, utility
replies and the end of the engine the other. A reader thread in the front end turns what
arrives into the same output queue the threaded client has, so ``AsyncLLM`` works unchanged.

Messages (tuples, pickled by the pipes): to the core ``("add", request)``, ``("abort", ids)``,
``("utility", call_id, method, args, kwargs)``, ``("shutdown",)``; from the core
``("ready", facts)``, ``("startup_error", exc)``, ``("out", outputs)``,
``("reply", call_id, ok, value)``, ``("dead", message)``.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from cadence.config import EngineConfig
from cadence.core_types import EngineCoreOutputs, EngineCoreRequest
from cadence.engine.core_client import EngineCoreClient
from cadence.engine.core_proc import EngineDead, EngineDeadError, OutputQueue, fail_future
from cadence.engine.engine_args import EngineArgs
from cadence.engine.request_checks import check_request_fits
from cadence.model.registry import ModelSpec

__all__ = ["CoreFacts", "ProcessEngineCoreClient"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CoreFacts:
    """What the front end reads of an engine core it cannot reach into (model, sizes)."""

    spec: ModelSpec
    config: EngineConfig
    max_model_len: int
    vocab_size: int
    num_kv_blocks: int
    block_size: int

    @classmethod
    def of(cls, core: Any) -> CoreFacts:
        return cls(core.spec, core.config, core.max_model_len, core.vocab_size,
                   core.num_kv_blocks, core.block_size)

    def validate_request(self, req: EngineCoreRequest) -> None:
        check_request_fits(req, self.config.scheduler.policy, self.num_kv_blocks,
                           self.block_size)


def _picklable(exc: BaseException) -> BaseException:
    import pickle

    try:
        pickle.dumps(exc)
        return exc
    except Exception:
        return RuntimeError(repr(exc))


def _child_main(args: EngineArgs, requests: Connection, replies: Connection) -> None:
    """The engine core process: build the core, then relay until told to stop."""
    from cadence.engine.core import EngineCore
    from cadence.engine.core_client import InprocEngineCoreClient

    try:
        client = InprocEngineCoreClient(lambda: EngineCore(args))
    except BaseException as exc:
        replies.send(("startup_error", _picklable(exc)))
        return
    replies.send(("ready", CoreFacts.of(client.proc.engine_core)))
    lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with lock:
            replies.send(message)

    def pump() -> None:  # step outputs, as the core makes them
        while True:
            try:
                outputs = client.get_output()
            except EngineDeadError as exc:
                send(("dead", str(exc)))
                return
            send(("out", outputs))

    threading.Thread(target=pump, name="cadence-core-outputs", daemon=True).start()

    def reply(call_id: int, fut: Future[Any]) -> None:
        exc = fut.exception()
        send(("reply", call_id, exc is None, fut.result() if exc is None else _picklable(exc)))

    while True:
        try:
            message = requests.recv()
        except (EOFError, OSError):  # the front end is gone
            break
        kind = message[0]
        try:
            if kind == "add":
                client.add_request(message[1])
            elif kind == "abort":
                client.abort_requests(message[1])
            elif kind == "utility":
                call_id, method, a, kw = message[1:]
                fut = client._submit_utility(method, a, kw)
                fut.add_done_callback(lambda f, call_id=call_id: reply(call_id, f))
            elif kind == "shutdown":
                break
        except EngineDeadError:
            continue  # the pump reports the death
    client.shutdown()


class ProcessEngineCoreClient(EngineCoreClient):
    """An engine core in a child process (spawned, so that it owns its CUDA context)."""

    def __init__(self, args: EngineArgs, *, startup_timeout: float | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        req_recv, self._requests = ctx.Pipe(duplex=False)
        self._replies, out_send = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=_child_main, args=(args, req_recv, out_send), name="cadence-engine-core",
            daemon=True,
        )  # fmt: skip
        self.process.start()
        req_recv.close()
        out_send.close()
        self._send_lock = threading.Lock()
        self._outputs = OutputQueue()
        self._calls: dict[int, Future[Any]] = {}
        self._call_ids = itertools.count()
        self._dead_error: EngineDeadError | None = None
        self._live: set[str] = set()
        self._progress = time.monotonic()
        if startup_timeout is not None and not self._replies.poll(startup_timeout):
            self.process.kill()
            raise TimeoutError(f"the engine core did not start within {startup_timeout} s")
        try:
            kind, payload = self._replies.recv()
        except EOFError:
            raise RuntimeError(
                f"the engine core process exited during start-up (code {self.process.exitcode})"
            ) from None
        if kind == "startup_error":
            self.process.join(10)
            raise payload
        self.facts: CoreFacts = payload
        self._reader = threading.Thread(target=self._read, name="cadence-core-reader",
                                        daemon=True)
        self._reader.start()

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
                code = self.process.exitcode
                self._die(f"The engine core process exited (code {code}).")
                return
            kind = message[0]
            if kind == "out":
                outputs: EngineCoreOutputs = message[1]
                self._progress = time.monotonic()
                if outputs.finished_requests:
                    self._live.difference_update(outputs.finished_requests)
                self.output_queue.put(outputs)
            elif kind == "reply":
                _, call_id, ok, value = message
                fut = self._calls.pop(call_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(value) if ok else fut.set_exception(value)
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
        return self._dead_error is not None or not self.process.is_alive()

    @property
    def last_progress_time(self) -> float:
        return self._progress

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Ask the core process to stop, then join it (killed if it does not stop in time)."""
        if self.process.is_alive():
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
