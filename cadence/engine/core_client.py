"""Clients of the engine core.

``EngineCoreClient`` is the interface the front ends (``AsyncLLM``) program against; the
in-process implementation talks to an ``EngineCoreProc`` thread through its queues. A
multi-process client (sockets instead of queues) can implement the same methods later.
"""

from __future__ import annotations

import abc
import asyncio
import queue
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from cadence.core_types import EngineCoreOutputs, EngineCoreRequest
from cadence.engine.core_proc import (
    EngineCoreLike,
    EngineCoreProc,
    EngineDead,
    EngineDeadError,
    EngineStopped,
    OutputItem,
    OutputQueue,
    RequestType,
    UtilityCall,
    fail_future,
)

__all__ = ["EngineCoreClient", "EngineDeadError", "InprocEngineCoreClient"]


class EngineCoreClient(abc.ABC):
    """Send requests to an engine core and receive its outputs."""

    @abc.abstractmethod
    def add_request(self, request: EngineCoreRequest) -> None: ...

    @abc.abstractmethod
    def abort_requests(self, request_ids: list[str]) -> None: ...

    # The core's outputs arrive in an ``OutputQueue``; a death marker in it raises.
    @property
    @abc.abstractmethod
    def output_queue(self) -> OutputQueue: ...

    @abc.abstractmethod
    def _unwrap(self, item: OutputItem) -> EngineCoreOutputs:
        """``item`` if it is outputs; else raise ``EngineDeadError`` (leaving the marker)."""

    @abc.abstractmethod
    def _submit_utility(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Future[Any]: ...

    def get_output(self, timeout: float | None = None) -> EngineCoreOutputs:
        """Block until the next outputs; raise ``EngineDeadError`` once the core is gone."""
        try:
            return self._unwrap(self.output_queue.get(timeout))
        except queue.Empty:
            raise TimeoutError("no engine core output within the timeout") from None

    async def get_output_async(self) -> EngineCoreOutputs:
        """Await the next outputs; raise ``EngineDeadError`` once the core is gone."""
        return self._unwrap(await self.output_queue.get_async())

    def call_utility(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on the core between two steps and return its result."""
        return self._submit_utility(method, args, kwargs).result()

    async def call_utility_async(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.wrap_future(self._submit_utility(method, args, kwargs))

    @property
    @abc.abstractmethod
    def errored(self) -> bool:
        """The core has died (crashed or was shut down)."""

    @property
    @abc.abstractmethod
    def last_progress_time(self) -> float:
        """``time.monotonic()`` of the core's last completed step (or of waking up to work)."""

    @abc.abstractmethod
    def shutdown(self, timeout: float | None = 10.0) -> None: ...

    # Async aliases with vLLM's names; queue puts never block, so they are plain calls.
    async def add_request_async(self, request: EngineCoreRequest) -> None:
        self.add_request(request)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        self.abort_requests(request_ids)


class InprocEngineCoreClient(EngineCoreClient):
    """Engine core in a thread of this process (``EngineCoreProc``)."""

    def __init__(
        self,
        core_factory: Callable[[], EngineCoreLike],
        *,
        startup_timeout: float | None = None,
    ) -> None:
        self.proc = EngineCoreProc(core_factory, startup_timeout=startup_timeout)
        self._dead_error: EngineDeadError | None = None

    @property
    def output_queue(self) -> OutputQueue:
        return self.proc.output_queue

    @property
    def errored(self) -> bool:
        return self._dead_error is not None or not self.proc.is_alive

    @property
    def last_progress_time(self) -> float:
        return self.proc.last_progress_time

    def _check_alive(self) -> None:
        if self.errored:
            raise self._dead_error or EngineDeadError()

    def add_request(self, request: EngineCoreRequest) -> None:
        self._check_alive()
        self.proc.send(RequestType.ADD, request)

    def abort_requests(self, request_ids: list[str]) -> None:
        # Aborts are idempotent and harmless after death: never raise here (cleanup paths).
        if request_ids and not self.errored:
            self.proc.send(RequestType.ABORT, list(request_ids))

    def _unwrap(self, item: OutputItem) -> EngineCoreOutputs:
        if isinstance(item, EngineCoreOutputs):
            return item
        if isinstance(item, EngineDead):
            err = EngineDeadError(f"The engine core died: {item.error!r}")
            err.__cause__ = item.error
        else:
            assert isinstance(item, EngineStopped)
            err = EngineDeadError("The engine core was shut down.")
        self._dead_error = err
        # Leave the marker for any later reader: every get after death raises.
        self.proc.output_queue.put(item)
        raise err

    def _submit_utility(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Future[Any]:
        self._check_alive()
        call = UtilityCall(method, args, kwargs)
        self.proc.send(RequestType.UTILITY, call)
        # The thread may have died between the check and the put, after draining its queue.
        if not self.proc.is_alive:
            fail_future(call.reply, self._dead_error or EngineDeadError())
        return call.reply

    def shutdown(self, timeout: float | None = 10.0) -> None:
        if self._dead_error is None:  # calls from now on say why they cannot run
            self._dead_error = EngineDeadError("The engine core was shut down.")
        self.proc.shutdown(timeout)
