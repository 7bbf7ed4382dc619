"""CUDA events (``cudaEventCreateWithFlags``); timing is off unless asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence.runtime._cudart import cudart
from cadence.runtime.errors import check, raise_for

if TYPE_CHECKING:
    from cadence.runtime.interfaces import EventLike, StreamLike


class Event:
    """A CUDA event. ``timing=False`` (the default) creates it with ``cudaEventDisableTiming``,
    the cheap kind for ordering and completion; ``timing=True`` allows ``elapsed_ms``."""

    def __init__(self, timing: bool = False) -> None:
        rt = cudart()
        self._rt = rt
        self._not_ready = rt.cudaError_t.cudaErrorNotReady
        self.timing = timing
        flags = rt.cudaEventDefault if timing else rt.cudaEventDisableTiming
        self.handle = check(rt.cudaEventCreateWithFlags(flags), "cudaEventCreateWithFlags")
        self.closed = False

    def record(self, stream: StreamLike) -> Event:
        """Record on ``stream``: the event completes when the stream's work so far is done."""
        (err,) = self._rt.cudaEventRecord(self.handle, stream.handle)
        if err:
            raise_for(err, "cudaEventRecord")
        return self

    def wait(self, stream: StreamLike) -> None:
        """Make ``stream`` wait (on the device, without blocking the host) for this event."""
        (err,) = self._rt.cudaStreamWaitEvent(stream.handle, self.handle, 0)
        if err:
            raise_for(err, "cudaStreamWaitEvent")

    def synchronize(self) -> None:
        """Block the host until the event has completed (at once if it was never recorded)."""
        (err,) = self._rt.cudaEventSynchronize(self.handle)
        if err:
            raise_for(err, "cudaEventSynchronize")

    def query(self) -> bool:
        """True when the event has completed, without blocking."""
        (err,) = self._rt.cudaEventQuery(self.handle)
        if not err:
            return True
        if err == self._not_ready:
            return False
        raise_for(err, "cudaEventQuery")
        return False  # unreachable

    def elapsed_ms(self, end: EventLike) -> float:
        """Milliseconds from this event to ``end``; both must be timing events, both completed."""
        if not (self.timing and end.timing):
            raise ValueError("elapsed_ms needs two events created with timing=True")
        return float(
            check(self._rt.cudaEventElapsedTime(self.handle, end.handle), "cudaEventElapsedTime")
        )

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        check(self._rt.cudaEventDestroy(self.handle), "cudaEventDestroy")

    def __enter__(self) -> Event:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
