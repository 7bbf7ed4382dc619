"""EngineCoreProc: the engine core running in its own thread, fed by an input queue.

The busy loop mirrors vLLM v1: block on the input queue while there is no work (no spinning),
otherwise drain every pending input without blocking (aborts included, so they are applied
before the next ``update_from_output``), then run one step and put its outputs on the output
queue. A crash anywhere in the loop puts an ``EngineDead`` marker on the output queue and fails
every pending utility call, so no caller waits forever.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Protocol

from cadence.core_types import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
)

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine core thread is gone; no request in flight will complete."""

    def __init__(self, message: str = "The engine core died; see the log for the cause.") -> None:
        super().__init__(message)


class EngineCoreLike(Protocol):
    """What the loop needs from an engine core (``cadence.engine.core.EngineCore``)."""

    def add_request(self, request: EngineCoreRequest) -> None: ...

    def abort_requests(self, request_ids: list[str]) -> None: ...

    def has_work(self) -> bool: ...

    @property
    def step_fn(self) -> Callable[[], tuple[EngineCoreOutputs | None, bool]]: ...

    def shutdown(self) -> None: ...


class RequestType(enum.Enum):
    ADD = enum.auto()
    ABORT = enum.auto()
    UTILITY = enum.auto()
    SHUTDOWN = enum.auto()
    FATAL = enum.auto()  # the core failed outside a step (payload: the error): end the loop


@dataclass
class UtilityCall:
    """Call ``method(*args, **kwargs)`` on the core (or read it, for a plain attribute)."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    reply: Future[Any] = field(default_factory=Future)


@dataclass(frozen=True)
class EngineDead:
    """Output-queue marker: the loop stopped because of ``error``."""

    error: BaseException


@dataclass(frozen=True)
class EngineStopped:
    """Output-queue marker: the loop ended after a shutdown request."""


OutputItem = EngineCoreOutputs | EngineDead | EngineStopped


class OutputQueue:
    """Thread-safe FIFO filled by the engine thread, read by one sync or one asyncio consumer.

    The asyncio side registers a future and the producer wakes it with
    ``call_soon_threadsafe``, so the event loop never polls and never blocks on the queue.
    """

    def __init__(self) -> None:
        self._items: collections.deque[OutputItem] = collections.deque()
        self._cond = threading.Condition()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    def put(self, item: OutputItem) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            loop, fut = waiter
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening
                pass

    def get(self, timeout: float | None = None) -> OutputItem:
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._items), timeout=timeout):
                raise queue.Empty
            return self._items.popleft()

    async def get_async(self) -> OutputItem:
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._items:
                    return self._items.popleft()
                fut: asyncio.Future[None] = loop.create_future()
                self._waiter = (loop, fut)
            try:
                await fut
            finally:
                with self._cond:
                    if self._waiter is not None and self._waiter[1] is fut:
                        self._waiter = None

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def fail_future(fut: Future[Any], exc: BaseException) -> None:
    try:
        if not fut.done():
            fut.set_exception(exc)
    except InvalidStateError:  # completed (or cancelled: a caller gave up) meanwhile
        pass


def resolve_future(fut: Future[Any], value: Any) -> None:
    try:
        if not fut.done():
            fut.set_result(value)
    except InvalidStateError:  # cancelled meanwhile by a caller that gave up waiting
        pass


class EngineCoreProc:
    """Runs an engine core in a background thread.

    The core is built inside the thread by ``core_factory`` so that any thread-local device
    state (current CUDA context and streams) belongs to the thread that steps it. Start-up
    errors are re-raised by the constructor.
    """

    def __init__(
        self,
        core_factory: Callable[[], EngineCoreLike],
        *,
        name: str = "cadence-engine-core",
        startup_timeout: float | None = None,
    ) -> None:
        self.input_queue: queue.SimpleQueue[tuple[RequestType, Any]] = queue.SimpleQueue()
        self.output_queue = OutputQueue()
        self._core: EngineCoreLike | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._error: BaseException | None = None
        self._stopped = False
        # Monotonic time of the loop's last sign of progress: a completed step, or waking up
        # with new inputs. A watchdog compares it with the clock while requests are unfinished.
        self._progress_time = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, args=(core_factory,), name=name, daemon=True
        )
        self._thread.start()
        if not self._ready.wait(startup_timeout):
            raise TimeoutError(f"the engine core did not start within {startup_timeout} s")
        if self._startup_error is not None:
            self._thread.join()
            raise self._startup_error

    # -- client side -------------------------------------------------------------------------
    @property
    def engine_core(self) -> EngineCoreLike:
        """The core object; for in-process inspection only (it is stepped by another thread)."""
        assert self._core is not None
        return self._core

    @property
    def thread(self) -> threading.Thread:
        """The thread that builds and steps the core."""
        return self._thread

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def last_progress_time(self) -> float:
        """``time.monotonic()`` of the last completed step (or of waking up to new work)."""
        return self._progress_time

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self._error is None and not self._stopped

    def send(self, request_type: RequestType, payload: Any = None) -> None:
        if request_type is RequestType.ABORT:
            # Also handed to the core at once: a step in progress applies it before its
            # update (vLLM's aborts queue). The queued copy keeps its order after an ADD, and
            # once handled it takes the early one back (an id may be reused afterwards).
            early = getattr(self._core, "early_aborts", None)
            payload = (early.add(payload) if early is not None else None, payload)
        self.input_queue.put((request_type, payload))

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Ask the loop to stop, then join the thread (idempotent)."""
        if self._thread.is_alive():
            self.send(RequestType.SHUTDOWN)
            if threading.current_thread() is self._thread:
                return  # e.g. a front end's finalizer run by a collection on this thread
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("The engine core thread did not stop within %s s.", timeout)

    # -- engine thread -----------------------------------------------------------------------
    def _run(self, core_factory: Callable[[], EngineCoreLike]) -> None:
        try:
            self._core = core_factory()
        except BaseException as exc:
            self._startup_error = exc
            self._ready.set()
            return
        register = getattr(self._core, "set_failure_callback", None)
        if register is not None:
            register(lambda exc: self.send(RequestType.FATAL, exc))
        self._ready.set()
        core = self._core
        try:
            self._busy_loop(core)
        except BaseException as exc:
            logger.exception("The engine core loop crashed.")
            self._error = exc
            self.output_queue.put(EngineDead(exc))
            self._fail_pending_inputs(exc)
        finally:
            try:
                core.shutdown()
            except Exception:
                logger.exception("Engine core shutdown failed.")

    def _busy_loop(self, core: EngineCoreLike) -> None:
        step_fn = core.step_fn
        while True:
            # 1) Block while idle; then drain everything pending without blocking.
            if not core.has_work():
                if not self._handle(core, *self.input_queue.get()):
                    return
                self._progress_time = time.monotonic()
            while True:
                try:
                    item = self.input_queue.get_nowait()
                except queue.Empty:
                    break
                if not self._handle(core, *item):
                    return
            # 2) One step, if anything is left to do after the inputs.
            if not core.has_work():
                continue
            outputs, _ = step_fn()
            self._progress_time = time.monotonic()
            if outputs is not None and (outputs.outputs or outputs.finished_requests):
                self.output_queue.put(outputs)

    def _handle(self, core: EngineCoreLike, request_type: RequestType, payload: Any) -> bool:
        """Apply one input; False means stop the loop."""
        if request_type is RequestType.ADD:
            self._add(core, payload)
        elif request_type is RequestType.ABORT:
            token, request_ids = payload
            if token is not None:
                core.early_aborts.discard(token)
            core.abort_requests(request_ids)
        elif request_type is RequestType.UTILITY:
            self._call_utility(core, payload)
        elif request_type is RequestType.SHUTDOWN:
            self._stopped = True
            self.output_queue.put(EngineStopped())
            self._fail_pending_inputs(EngineDeadError("The engine core was shut down."))
            return False
        elif request_type is RequestType.FATAL:
            raise payload
        else:  # pragma: no cover - exhaustive over RequestType
            raise ValueError(f"unknown engine core request type {request_type!r}")
        return True

    def _add(self, core: EngineCoreLike, request: EngineCoreRequest) -> None:
        try:
            core.add_request(request)
        except Exception as exc:
            # The front end validates first; a request the core still refuses fails alone
            # instead of taking the whole engine down.
            logger.warning("Engine core refused request %r: %r", request.request_id, exc)
            out = EngineCoreOutput(
                request.request_id, [], finish_reason=FinishReason.ERROR, error=str(exc)
            )
            self.output_queue.put(
                EngineCoreOutputs(outputs=[out], finished_requests={request.request_id})
            )

    @staticmethod
    def _call_utility(core: EngineCoreLike, call: UtilityCall) -> None:
        try:
            attr = getattr(core, call.method)
            result = attr(*call.args, **call.kwargs) if callable(attr) else attr
        except Exception as exc:
            fail_future(call.reply, exc)
        else:
            resolve_future(call.reply, result)

    def _fail_pending_inputs(self, exc: BaseException) -> None:
        dead = exc if isinstance(exc, EngineDeadError) else EngineDeadError()
        while True:
            try:
                request_type, payload = self.input_queue.get_nowait()
            except queue.Empty:
                return
            if request_type is RequestType.UTILITY:
                fail_future(payload.reply, dead)
