"""The OpenAI-compatible Starlette application."""

from __future__ import annotations

import hmac
import json
import logging
import re
from importlib import metadata
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from cadence.metrics import CONTENT_TYPE_LATEST, PrometheusStatLogger
from cadence.server.errors import (
    APIError,
    AuthenticationError,
    BadRequestError,
    InternalServerError,
    RequestTooLargeError,
    ServiceUnavailableError,
    from_validation_error,
)
from cadence.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    ParamError,
    random_id,
)
from cadence.server.serving_chat import OpenAIServingChat
from cadence.server.serving_completion import OpenAIServingCompletion
from cadence.server.sse import ClientDisconnected, EventStreamResponse, run_until_disconnect

if TYPE_CHECKING:
    from cadence.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * 1024 * 1024
# A declared-too-large body is still read (and dropped) up to this size so that the client can
# read the 413 instead of failing on a reset connection; beyond it the connection is dropped.
_DRAIN_LIMIT_BYTES = 64 * 1024 * 1024

M = TypeVar("M", bound=BaseModel)


def cadence_version() -> str:
    try:
        return metadata.version("cadence")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


class ApiKeyMiddleware:
    """Require ``Authorization: Bearer <key>`` on every ``/v1`` route (pure ASGI)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                err = AuthenticationError("Unauthorized: a valid API key is required.", None)
                response = err.response()
                response.headers["www-authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class OpenAIServer:
    """Route handlers over one ``AsyncLLM``."""

    def __init__(
        self,
        engine: AsyncLLM,
        *,
        served_model_name: str | None = None,
        max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
    ) -> None:
        self.engine = engine
        self.model_name = served_model_name or engine.model_name
        self.max_request_body_bytes = max_request_body_bytes
        self.completions = OpenAIServingCompletion(engine, self.model_name)
        self.chat = OpenAIServingChat(engine, self.model_name)
        self.metrics = PrometheusStatLogger(self.model_name)
        engine.add_stat_logger(self.metrics)

    async def read_json(self, request: Request, model: type[M]) -> M:
        limit = self.max_request_body_bytes
        declared = request.headers.get("content-length")
        too_large = declared is not None and declared.isdigit() and int(declared) > limit
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > (_DRAIN_LIMIT_BYTES if too_large else limit):
                too_large = True
                if len(body) > _DRAIN_LIMIT_BYTES:
                    break
        if too_large or len(body) > limit:
            raise RequestTooLargeError(
                f"Request body too large: the limit is {limit} bytes.", param=None
            )
        data = parse_json_body(bytes(body))
        try:
            parsed = model.model_validate(data)
        except ValidationError as exc:
            raise from_validation_error(exc) from exc
        try:
            parsed.check()  # type: ignore[attr-defined]
        except ParamError as exc:
            raise BadRequestError(str(exc), exc.param) from exc
        return parsed

    # -- routes ------------------------------------------------------------------------------
    async def create_completion(self, request: Request) -> Response:
        body = await self.read_json(request, CompletionRequest)
        self.completions.check_model(body.model)
        if body.stream:
            base_id = random_id("cmpl")
            started = await self.completions.start_all(body, base_id)
            ids = [s.request_id for s in started]
            return EventStreamResponse(
                self.completions.stream(body, started, base_id),
                on_close=lambda: self.completions.abort(ids),
            )
        result = await self._until_disconnect(self.completions.create(body), request)
        return JSONResponse(result.model_dump(mode="json"))

    async def create_chat_completion(self, request: Request) -> Response:
        body = await self.read_json(request, ChatCompletionRequest)
        self.chat.check_model(body.model)
        if body.stream:
            started = await self.chat.start_chat(body, random_id("chatcmpl"))
            return EventStreamResponse(
                self.chat.stream(body, started),
                on_close=lambda: self.chat.abort([started.request_id]),
            )
        result = await self._until_disconnect(self.chat.create(body), request)
        return JSONResponse(result.model_dump(mode="json"))

    async def _until_disconnect(self, work: Any, request: Request) -> Any:
        try:
            return await run_until_disconnect(work, request.receive)
        except ClientDisconnected:
            # Nobody will read this; the work was cancelled and its requests aborted.
            return Response(status_code=499)

    async def show_models(self, request: Request) -> Response:
        card = ModelCard(
            id=self.model_name, root=self.engine.model_name, max_model_len=self.engine.max_model_len
        )
        return JSONResponse(ModelList(data=[card]).model_dump(mode="json"))

    async def health(self, request: Request) -> Response:
        if self.engine.errored:
            err = ServiceUnavailableError("The engine is not running.", None)
            return err.response()
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": cadence_version()})

    async def metrics_endpoint(self, request: Request) -> Response:
        if not self.engine.errored:
            try:
                await self.engine.do_log_stats()
            except Exception:  # the engine died during the scrape: serve what we have
                logger.warning("Could not refresh scheduler stats for /metrics.")
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


# A JSON string escape of a UTF-16 surrogate; a lone one decodes to a str that cannot be encoded.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_body(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object; anything else is a 400 (never a 500)."""
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise BadRequestError("Invalid JSON in request body: nested too deeply.", None) from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the int digit limit
        raise BadRequestError(f"Invalid JSON in request body: {exc}", param=None) from exc
    if not isinstance(data, dict):
        raise BadRequestError("The request body must be a JSON object.", param=None)
    if _SURROGATE_ESCAPE.search(body) is not None:
        _check_encodable(data, "")
    return data


def _check_encodable(value: Any, path: str) -> None:
    """Every string and key must be valid Unicode (no lone surrogates); names the field."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not _encodable(item):
                raise BadRequestError(
                    f"{where or 'body'}: invalid Unicode (a lone surrogate) in a string.",
                    where or None,
                )
        elif isinstance(item, dict):
            for key, sub in item.items():
                if not _encodable(key):
                    raise BadRequestError(
                        f"{where or 'body'}: invalid Unicode (a lone surrogate) in a key.",
                        where or None,
                    )
                stack.append((sub, f"{where}.{key}" if where else key))
        elif isinstance(item, list):
            stack.extend((sub, f"{where}.{i}") for i, sub in enumerate(item))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response()


async def _param_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ParamError)
    return BadRequestError(str(exc), exc.param).response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    err = APIError(str(exc.detail), None)
    err.status_code = exc.status_code
    err.type = "NotFoundError" if exc.status_code == 404 else "HTTPError"
    return err.response()


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    logger.exception("Unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return InternalServerError(f"Internal server error: {exc!r}").response()


def build_app(
    engine: AsyncLLM,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
) -> Starlette:
    """The application serving ``engine``; the caller owns the engine's lifetime."""
    server = OpenAIServer(
        engine, served_model_name=served_model_name, max_request_body_bytes=max_request_body_bytes
    )
    routes = [
        Route("/v1/completions", server.create_completion, methods=["POST"]),
        Route("/v1/chat/completions", server.create_chat_completion, methods=["POST"]),
        Route("/v1/models", server.show_models, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/version", server.version, methods=["GET"]),
        Route("/metrics", server.metrics_endpoint, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            APIError: _api_error,
            ParamError: _param_error,
            HTTPException: _http_error,
            Exception: _unexpected_error,
        },
    )
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.state.server = server
    return app
