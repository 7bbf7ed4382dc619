"""Server-sent events, client disconnects and server stops at the ASGI level.

Starlette's ``StreamingResponse`` stops listening for ``http.disconnect`` under ASGI spec 2.4
(it then only notices a vanished client when a write fails), so a request waiting in the queue
would keep its engine slot. Here the body producer always races a disconnect watcher: the first
``http.disconnect`` cancels the producer, which aborts the request in the engine. It also races
the server's stop event (the shutdown deadline): a stopped stream ends with an error event and
``[DONE]``, never as if it were complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from starlette.types import Receive, Scope, Send

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How long the closing frames of a stopped stream may wait for a slow reader.
_STOP_FRAMES_TIMEOUT_S = 2.0


class ClientDisconnected(Exception):
    """The HTTP client went away before the answer was complete."""


class ServerStopping(Exception):
    """The server's stop event fired before the answer was complete."""


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(
    work: Awaitable[T], receive: Receive | None, stop: asyncio.Event | None = None
) -> T:
    """Await ``work``; cancel it and raise ``ClientDisconnected`` if the client leaves first, or
    ``ServerStopping`` if ``stop`` is set first. ``receive=None``: the body is still being read
    (by ``work``), so nobody else may listen for the disconnect."""
    task = asyncio.ensure_future(work)
    watchers: dict[asyncio.Future[object], type[Exception]] = {}
    if receive is not None:
        watchers[asyncio.ensure_future(_wait_for_disconnect(receive))] = ClientDisconnected
    if stop is not None:
        watchers[asyncio.ensure_future(stop.wait())] = ServerStopping
    if not watchers:
        return await task
    try:
        done, _ = await asyncio.wait({task, *watchers}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        for watcher in watchers:
            watcher.cancel()
        for watcher in watchers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    cause = next(watchers[w] for w in watchers if w in done)
    raise cause


class EventStreamResponse:
    """``text/event-stream`` ASGI response: each item of ``frames`` is sent as it comes."""

    def __init__(
        self,
        frames: AsyncIterator[str],
        *,
        on_close: Callable[[], None] | None = None,
        headers: dict[str, str] | None = None,
        stop: asyncio.Event | None = None,
        stop_frames: Callable[[], list[str]] | None = None,
        label: str = "",
    ) -> None:
        """``stop``: when set, the stream is cut and ends with ``stop_frames()``; ``label``
        names the stream in the log (its request id)."""
        self.frames = frames
        # Runs however the response ends, even if ``frames`` never started (then its own
        # cleanup never runs): the place to abort what the stream was for.
        self.on_close = on_close
        self.headers = {"cache-control": "no-cache", **(headers or {})}
        self.stop = stop
        self.stop_frames = stop_frames
        self.label = label

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        raw_headers += [(k.encode(), v.encode()) for k, v in self.headers.items()]
        started = False

        async def start() -> None:
            nonlocal started
            if not started:
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": raw_headers})

        async def produce() -> None:
            try:
                await start()
                async for frame in self.frames:
                    await send(
                        {"type": "http.response.body", "body": frame.encode(), "more_body": True}
                    )
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                aclose = getattr(self.frames, "aclose", None)
                if aclose is not None:
                    await aclose()

        client = scope.get("client")
        peer = f"{client[0]}:{client[1]}" if client else "a client"
        try:
            await run_until_disconnect(produce(), receive, self.stop)
        except ClientDisconnected:
            logger.info(
                "Client %s disconnected during stream %r; its request was aborted.",
                peer,
                self.label,
            )
        except ServerStopping:
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(self._send_stop_frames(start, send), _STOP_FRAMES_TIMEOUT_S)
        except OSError:  # the write failed: the client is gone (ASGI spec >= 2.4)
            logger.info(
                "Connection of %s lost during stream %r; its request was aborted.", peer, self.label
            )
        finally:
            if self.on_close is not None:
                self.on_close()

    async def _send_stop_frames(self, start: Callable[[], Awaitable[None]], send: Send) -> None:
        await start()
        for frame in self.stop_frames() if self.stop_frames is not None else []:
            await send({"type": "http.response.body", "body": frame.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
