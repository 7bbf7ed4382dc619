"""Launch tapes: the kernel launches of one pass, recorded while the pass runs, then replayed in
order with one C call each and none of the Python that decided them.

This is the eager path's answer to host cost where no CUDA graph is used. Inside
``with recording() as rec:`` every launch of a ``PreparedLaunch`` (the compiled Triton kernels
behind ``TritonLaunch`` and the skinny GEMM plans) is also bound to its arguments
(``bind_compiled_triton``: packed parameters) and appended to ``rec``; anything the tape could
not replay refuses the recording instead (``rec.refuse(why)``): a Triton launch that compiles
or takes Triton's own path, a ``BoundKernel`` launch (its caller may change its parameters
between launches), launches on more than one stream. A caller that also runs torch ops checks
them itself (see ``graphs/tapes.py``).

Hazards: a tape holds addresses and frozen host decisions. Every buffer a recorded launch
reads or writes must stay allocated at the same address for as long as the tape is replayed,
and a replay repeats the recorded grids and scalars: key tapes by everything that decides them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

_RECORDER: ContextVar[TapeRecorder | None] = ContextVar("cadence_launch_tape", default=None)


def active_recorder() -> TapeRecorder | None:
    """The recorder of the pass running in this context, if one is being recorded."""
    return _RECORDER.get()


class TapeRecorder:
    """What a recording pass launched, in order, and why it cannot be replayed (if so)."""

    def __init__(self) -> None:
        self.launches: list[Any] = []  # BoundKernel-likes: .launch(stream), optional .c_call
        # Each Triton launch's parameter values: the tape's owner decides which of the buffers
        # among them it must keep alive (the binding holds only their addresses).
        self.values: list[Sequence[Any]] = []
        self.stream: int | None = None
        self.refused: str | None = None

    def add(self, kernel: Any, stream: int, values: Sequence[Any] | None = None) -> None:
        """Append ``kernel`` (launched on the raw ``stream`` handle); ``values``: the
        parameter values it was bound to, when it holds only their addresses."""
        if self.stream is None:
            self.stream = stream
        elif stream != self.stream:
            self.refuse(f"launches on two streams ({self.stream:#x} and {stream:#x})")
        self.launches.append(kernel)
        if values is not None:
            self.values.append(values)

    def refuse(self, why: str) -> None:
        """Mark the recording as not replayable (the first reason is kept)."""
        if self.refused is None:
            self.refused = why


@contextlib.contextmanager
def recording() -> Iterator[TapeRecorder]:
    """Record the launches made in this context (this thread or task only)."""
    recorder = TapeRecorder()
    token = _RECORDER.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDER.reset(token)


class LaunchTape:
    """Recorded launches, replayed in order on the stream they were recorded on."""

    def __init__(self, recorder: TapeRecorder, keepalive: Sequence[Any] = ()) -> None:
        if recorder.refused is not None:
            raise ValueError(f"a refused recording is no tape: {recorder.refused}")
        self.kernels = list(recorder.launches)
        self.stream = recorder.stream or 0
        self._keepalive = tuple(keepalive)
        calls: list[Callable[[], Any]] = []
        for kernel in self.kernels:
            c_call = getattr(kernel, "c_call", None)
            call = c_call(self.stream) if c_call is not None else None
            calls.append(call if call is not None else functools.partial(kernel.launch,
                                                                        self.stream))
        self._calls = calls

    def __len__(self) -> int:
        return len(self.kernels)

    def replay(self) -> None:
        """Launch every recorded kernel again (asynchronously, in the recorded order)."""
        for i, call in enumerate(self._calls):
            if call():  # a driver error code from the C entry point; None or 0 otherwise
                # Launch it again through the checked path, which raises the error.
                self.kernels[i].launch(self.stream)
