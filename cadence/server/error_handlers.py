"""How each exception a route lets escape becomes a response: OpenAI-style errors as they
are, a bad parameter as a 400 naming it, Starlette's HTTP errors in the same shape, a dead
engine as a 503, a departed client as nothing (logged), anything else as a logged 500
(``UnexpectedErrorMiddleware``: answered on a connection that stays open)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cadence.engine.core_client import EngineDeadError
from cadence.server.errors import APIError, BadRequestError, InternalServerError
from cadence.server.protocol import ParamError
from cadence.server.serving import engine_unavailable
from cadence.server.sse import ClientDisconnected

logger = logging.getLogger(__name__)

Handler = Callable[[Request, Exception], Awaitable[Response]]


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response()


async def _param_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ParamError)
    return BadRequestError(str(exc), exc.param).response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    # Starlette's own headers stay (a 405's Allow, which HTTP requires).
    err = APIError(str(exc.detail), None, headers=dict(exc.headers) if exc.headers else None)
    err.status_code = exc.status_code
    err.type = "NotFoundError" if exc.status_code == 404 else "HTTPError"
    return err.response()


async def _engine_dead(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EngineDeadError)
    return engine_unavailable(exc).response()


async def _client_disconnected(request: Request, exc: Exception) -> Response:
    client = request.client
    peer = f"{client.host}:{client.port}" if client else "a client"
    logger.info("Client %s disconnected %s.", peer, exc)
    return Response(status_code=499)  # never sent: the connection is gone


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    logger.exception("Unhandled error in %s %r", request.method, request.url.path, exc_info=exc)
    return InternalServerError(f"Internal server error: {exc!r}").response()


class UnexpectedErrorMiddleware:
    """An exception no handler took, before its response started, becomes the logged 500 of
    ``_unexpected_error`` here (pure ASGI, inside Starlette's own catch-all). Starlette's
    catch-all answers too but then re-raises, so the server logs the error a second time and
    drops the client's keep-alive connection. Once a response has started (a stream) the error
    propagates: there is nothing left to answer with."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if started:
                raise
            response = await _unexpected_error(Request(scope, receive), exc)
            await response(scope, receive, send)


def exception_handlers() -> dict[type[Exception], Handler]:
    """Starlette's ``exception_handlers``, most specific first."""
    return {
        APIError: _api_error,
        ParamError: _param_error,
        HTTPException: _http_error,
        EngineDeadError: _engine_dead,
        ClientDisconnected: _client_disconnected,
        Exception: _unexpected_error,
    }
