"""Where a request's outputs go: the ``OutputSink`` protocol and the single-slot
``RequestOutputCollector`` between the output processor and one ``generate()``."""

from __future__ import annotations

import asyncio
import threading
from typing import Protocol

from cadence.outputs import RequestOutput
from cadence.sampling_params import RequestOutputKind

__all__ = ["OutputSink", "RequestFailedError", "RequestOutputCollector"]


class RequestFailedError(RuntimeError):
    """One request failed inside the engine; the engine and every other request go on."""

    def __init__(self, request_id: str, reason: str) -> None:
        super().__init__(f"Request {request_id} failed in the engine: {reason}")
        self.request_id = request_id
        self.reason = reason


class OutputSink(Protocol):
    """Where the output processor puts one request's outputs (and a final exception, if any).

    ``put`` runs on the thread that processes outputs; ``needs_metrics`` says whether outputs
    that are not final carry a snapshot of the request's metrics (a copy per output).
    """

    needs_metrics: bool

    def put(self, output: RequestOutput | Exception) -> None: ...


class RequestOutputCollector:
    """A single slot between the output processor (producer) and one ``generate()`` (consumer).

    When the producer gets ahead, DELTA outputs are merged into the waiting one (text appended,
    token ids and logprobs extended, latest finish reason); other kinds replace it. An exception
    always takes the slot, and is never replaced by a later output.
    """

    needs_metrics = True

    def __init__(
        self, output_kind: RequestOutputKind = RequestOutputKind.DELTA, request_id: str = ""
    ) -> None:
        self.aggregate = output_kind == RequestOutputKind.DELTA
        self.request_id = request_id
        self.output: RequestOutput | Exception | None = None
        self.ready = asyncio.Event()
        self._lock = threading.Lock()
        # Loop (and its thread) of the consumer, so a producer on another thread wakes it safely.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        try:
            self._bind(asyncio.get_running_loop())
        except RuntimeError:
            pass  # made outside a loop: bound by the first get()

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()

    def put(self, output: RequestOutput | Exception) -> None:
        with self._lock:
            if self.output is None or isinstance(output, Exception):
                self.output = output
            elif isinstance(self.output, RequestOutput):
                self.output.add(output, aggregate=self.aggregate)
        self._wake()

    def _wake(self) -> None:
        loop = self._loop
        if loop is not None and threading.get_ident() != self._loop_thread:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self.ready.set)
            return
        self.ready.set()

    async def get(self) -> RequestOutput:
        """Wait for an output; raises the exception stored by ``put`` instead, if any."""
        if self._loop is None:
            self._bind(asyncio.get_running_loop())
        while True:
            out = self._take()
            if out is not None:
                return out
            await self.ready.wait()

    def get_nowait(self) -> RequestOutput | None:
        """The waiting output, or None; raises a stored exception."""
        return self._take()

    def _take(self) -> RequestOutput | None:
        with self._lock:
            out = self.output
            self.output = None
            self.ready.clear()
        if isinstance(out, Exception):
            raise out
        return out
