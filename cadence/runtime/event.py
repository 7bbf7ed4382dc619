"""CUDA events (``cudaEventCreateWithFlags``); timing is off unless asked for.

Ordering goes one way only: a stream waits for an event (``stream.wait(event)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence.runtime._cudart import cudart, on_device
from cadence.runtime.errors import check, raise_for

if TYPE_CHECKING:
    from cadence.runtime.interfaces import EventLike, StreamLike


class Event:
    """A CUDA event on device ``device_index``. ``timing=False`` (the default) creates it with
    ``cudaEventDisableTiming``, the cheap kind for ordering and completion; ``timing=True``
    allows ``elapsed_ms``. Record it only on streams of its own device."""

    def __init__(self, timing: bool = False, device_index: int = 0) -> None:
        rt = cudart()
        self._rt = rt
        self._not_ready = rt.cudaError_t.cudaErrorNotReady
        self.timing = timing
        self.device_index = device_index
        flags = rt.cudaEventDefault if timing else rt.cudaEventDisableTiming
        with on_device(device_index):
            self.handle = check(rt.cudaEventCreateWithFlags(flags), "cudaEventCreateWithFlags")
        self.closed = False

    def record(self, stream: StreamLike) -> Event:
        """Record on ``stream``: the event completes when the stream's work so far is done."""
        (err,) = self._rt.cudaEventRecord(self.handle, stream.handle)
        if err:
            raise_for(err, "cudaEventRecord")
        return self

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

    def __repr__(self) -> str:
        return f"Event(timing={self.timing}, device={self.device_index}, closed={self.closed})"
