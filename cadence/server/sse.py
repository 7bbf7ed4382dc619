"""Server-sent events and client-disconnect handling at the ASGI level.

Starlette's ``StreamingResponse`` stops listening for ``http.disconnect`` under ASGI spec 2.4
(it then only notices a vanished client when a write fails), so a request waiting in the queue
would keep its engine slot. Here the body producer always races a disconnect watcher: the first
``http.disconnect`` cancels the producer, which aborts the request in the engine.
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


class ClientDisconnected(Exception):
    """The HTTP client went away before the answer was complete."""


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(work: Awaitable[T], receive: Receive) -> T:
    """Await ``work``; cancel it and raise ``ClientDisconnected`` if the client leaves first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientDisconnected


class EventStreamResponse:
    """``text/event-stream`` ASGI response: each item of ``frames`` is sent as it comes."""

    def __init__(
        self,
        frames: AsyncIterator[str],
        *,
        on_close: Callable[[], None] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.frames = frames
        # Runs however the response ends, even if ``frames`` never started (then its own
        # cleanup never runs): the place to abort what the stream was for.
        self.on_close = on_close
        self.headers = {"cache-control": "no-cache", **(headers or {})}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        raw_headers += [(k.encode(), v.encode()) for k, v in self.headers.items()]

        async def produce() -> None:
            try:
                await send({"type": "http.response.start", "status": 200, "headers": raw_headers})
                async for frame in self.frames:
                    await send(
                        {"type": "http.response.body", "body": frame.encode(), "more_body": True}
                    )
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                aclose = getattr(self.frames, "aclose", None)
                if aclose is not None:
                    await aclose()

        try:
            await run_until_disconnect(produce(), receive)
        except ClientDisconnected:
            logger.debug("Client disconnected during a stream.")
        except OSError:  # the write failed: the client is gone (ASGI spec >= 2.4)
            logger.debug("Client connection lost during a stream.")
        finally:
            if self.on_close is not None:
                self.on_close()
