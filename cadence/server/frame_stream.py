"""The output sink of a streamed response: outputs become SSE frames as the engine makes them.

A streamed request does not go through a ``RequestOutputCollector`` and ``generate()``: the
output processor hands each output to a ``FrameSink``, which renders its frame at once and
appends it to the response's ``FrameStream``; the response task wakes once for whatever
accumulated and writes it in one piece. At low load that is one token per write (real
token-by-token streaming); when the event loop falls behind, the frames of several steps go out
together instead of piling up as work. One ``FrameStream`` may be fed by several requests (a
completions request with several prompts).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cadence.outputs import RequestOutput

Render = Callable[["RequestOutput"], "str | None"]


class FrameStream:
    """Frames waiting to be written for one SSE response, from ``num_requests`` requests."""

    def __init__(self, num_requests: int = 1) -> None:
        self._frames: list[str] = []
        self._ready = asyncio.Event()
        self._open = num_requests
        self.error: Exception | None = None

    def sink(self, render: Render) -> FrameSink:
        """The output sink of one of the requests; ``render`` turns an output into a frame
        (or None when it shows nothing, e.g. text held back for a possible stop string)."""
        return FrameSink(self, render)

    @property
    def finished(self) -> bool:
        return self._open <= 0

    def _push(self, frame: str | None, finished: bool) -> None:
        if frame:
            self._frames.append(frame)
        if finished:
            self._open -= 1
        self._ready.set()

    def _fail(self, exc: Exception) -> None:
        self.error = exc
        self._open = 0
        self._ready.set()

    async def next(self) -> str | None:
        """The frames accumulated since the last call, joined (waits for at least one), or
        None once every request finished (or failed) and everything was taken."""
        while not self._frames:
            if self._open <= 0:
                return None
            self._ready.clear()
            await self._ready.wait()
        frames, self._frames = self._frames, []
        return frames[0] if len(frames) == 1 else "".join(frames)


class FrameSink:
    """``OutputSink`` of one request of a ``FrameStream`` (called on the event loop's thread)."""

    needs_metrics = False

    def __init__(self, stream: FrameStream, render: Render) -> None:
        self._stream = stream
        self._render = render

    def put(self, output: RequestOutput | Exception) -> None:
        if isinstance(output, Exception):
            self._stream._fail(output)
            return
        self._stream._push(self._render(output), output.finished)
