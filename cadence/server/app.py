"""The OpenAI-compatible Starlette application."""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client.exposition import gzip_accepted
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cadence.chat_options import template_kwargs_with_defaults
from cadence.metrics import PrometheusStatLogger, cache_config_info
from cadence.server.api_operations import API_OPERATIONS
from cadence.server.error_handlers import UnexpectedErrorMiddleware, exception_handlers
from cadence.server.errors import (
    BadRequestError,
    NotFoundError,
    ServiceUnavailableError,
    from_validation_error,
)
from cadence.server.json_body import json_response
from cadence.server.lifecycle import InFlightMiddleware, RequestLifecycle, shutting_down_error
from cadence.server.live_stats import SecondsRecorder, engine_config_summary, stats_document
from cadence.server.middleware import ApiKeyMiddleware, RequestIdHeaderMiddleware, api_keys
from cadence.server.openapi import openapi_document
from cadence.server.profile_routes import profile_routes
from cadence.server.protocol import SamplingRequest, response_and_engine_ids
from cadence.server.protocol_chat import ChatCompletionRequest
from cadence.server.protocol_completion import CompletionRequest
from cadence.server.protocol_responses import ModelCard, ModelList
from cadence.server.reasoning import reasoning_parser as reasoning_parser_named
from cadence.server.request_body import parse_json_body, read_body, validate_request
from cadence.server.responses_api import ResponsesRequest
from cadence.server.serving import DONE_FRAME
from cadence.server.serving_chat import OpenAIServingChat
from cadence.server.serving_completion import OpenAIServingCompletion
from cadence.server.serving_responses import OpenAIServingResponses
from cadence.server.settings import (
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    ResponseOptions,
    ServerSettings,
)
from cadence.server.sse import (
    ClientDisconnected,
    EventStreamResponse,
    ServerStopping,
    run_until_disconnect,
)
from cadence.server.tokenization import Tokenization
from cadence.server.watchdog import DEFAULT_ENGINE_STALL_TIMEOUT_S, EngineWatchdog
from cadence.server.web_page import WebPage

if TYPE_CHECKING:
    from cadence.engine.async_llm import AsyncLLM

__all__ = ["DEFAULT_MAX_REQUEST_BODY_BYTES", "OpenAIServer", "build_app"]

logger = logging.getLogger(__name__)

DEFAULT_BODY_READ_TIMEOUT_S = ServerSettings.body_read_timeout

M = TypeVar("M", bound=BaseModel)
# Unknown field names logged once each: this many are remembered (a client sending fresh names
# must not grow the server's memory), and a warning names this many of a request's at most.
# How long a /metrics or /stats scrape waits for the engine's scheduler stats (see
# ``OpenAIServer._refresh_stats``).
STATS_WAIT_S = 1.0
UNKNOWN_FIELDS_KEPT = 256
UNKNOWN_FIELDS_NAMED = 8

T = TypeVar("T")


def cadence_version() -> str:
    try:
        return metadata.version("cadence")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


class OpenAIServer:
    """Route handlers over one ``AsyncLLM``."""

    def __init__(
        self,
        engine: AsyncLLM,
        *,
        served_model_name: str | Sequence[str] | None = None,
        max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
        body_read_timeout: float = DEFAULT_BODY_READ_TIMEOUT_S,
        engine_stall_timeout: float = DEFAULT_ENGINE_STALL_TIMEOUT_S,
        front_end_index: int | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.engine = engine
        self._stats_refresh: asyncio.Future[None] | None = None  # see _refresh_stats
        # Several served names (vLLM): any is accepted, and a response carries the one its
        # request named (the first where it named none).
        names = ([served_model_name] if isinstance(served_model_name, str)
                 else list(served_model_name or []))
        self.model_names: list[str] = list(dict.fromkeys(names)) or [engine.model_name]
        self.model_name = self.model_names[0]
        self.max_request_body_bytes = max_request_body_bytes
        self.body_read_timeout = body_read_timeout
        aliases = tuple(self.model_names[1:])
        self.completions = OpenAIServingCompletion(engine, self.model_name, aliases)
        self.chat = OpenAIServingChat(engine, self.model_name, aliases)
        self.chat.chat_template = chat_template
        self.responses = OpenAIServingResponses(self.chat)
        # One registry of beam searches: the stream's closing abort (any endpoint's) finds it.
        self.chat.beams = self.completions.beams
        # One of several API server processes: metrics in the shared multiprocess files.
        self.metrics = PrometheusStatLogger(
            self.model_name, multiprocess=front_end_index is not None,
            engine_stats=front_end_index in (None, 0), max_model_len=engine.max_model_len,
            cache_info=cache_config_info(engine.args, engine.block_size, engine.num_kv_blocks))
        engine.add_stat_logger(self.metrics)
        self.seconds = SecondsRecorder()
        engine.add_stat_logger(self.seconds)
        self._config_summary: dict[str, Any] | None = None
        self.lifecycle = RequestLifecycle()
        self.watchdog = EngineWatchdog(engine, engine_stall_timeout)
        self.tokenization = Tokenization(engine, chat_template)
        self._openapi: bytes | None = None
        self._unknown_fields_logged: set[str] = set()

    async def read_json(self, request: Request, model: type[M]) -> M:
        body = await read_body(request, self.max_request_body_bytes, self.body_read_timeout)
        # Parsing and validating a body of megabytes is CPU work: off the event loop.
        parsed, unknown = await self.engine.run_cpu(len(body), validate_request, body, model)
        seen = self._unknown_fields_logged
        if unknown and len(seen) < UNKNOWN_FIELDS_KEPT and not unknown <= seen:
            new = sorted(unknown - seen)
            seen.update(new[: UNKNOWN_FIELDS_KEPT - len(seen)])
            # Once per name, as a hint to the client's author: unknown fields are ignored.
            # Escaped: a name is client text, and a newline in it would forge a log line.
            shown = ", ".join(name[:64].encode("unicode_escape").decode("ascii")
                              for name in new[:UNKNOWN_FIELDS_NAMED])
            more = len(new) - UNKNOWN_FIELDS_NAMED
            logger.warning("Ignored unknown field(s) in a %s: %s%s (logged once per name%s).",
                           model.__name__, shown, f" and {more} more" if more > 0 else "",
                           "; no more names are remembered" if len(seen) >= UNKNOWN_FIELDS_KEPT
                           else "")
        return parsed

    # -- routes ------------------------------------------------------------------------------
    async def create_completion(self, request: Request) -> Response:
        body = await self._stoppable(self.read_json(request, CompletionRequest))
        self.completions.check_model(body.model)
        self._apply_options(body)
        response_id, engine_id = response_and_engine_ids(
            "cmpl", request.headers.get("x-request-id"), body.request_id)
        if body.stream:
            cs = self.completions.new_stream(body, response_id)
            started = await self._stoppable(self.completions.start_all(body, engine_id, cs))
            ids = [s.request_id for s in started]
            return self._event_stream(self.completions.stream(started, cs), ids, response_id)
        return await self._respond(self.completions.create(body, engine_id, response_id),
                                   request, response_id)

    async def create_chat_completion(self, request: Request) -> Response:
        body = await self._stoppable(self.read_json(request, ChatCompletionRequest))
        self.chat.check_model(body.model)
        self._apply_options(body)
        response_id, engine_id = response_and_engine_ids(
            "chatcmpl", request.headers.get("x-request-id"), body.request_id)
        if body.stream:
            cs = self.chat.new_stream(body, response_id)
            started = await self._stoppable(self.chat.start_chat(body, engine_id, cs))
            return self._event_stream(self.chat.stream(started, cs), [engine_id], response_id)
        return await self._respond(self.chat.create(body, engine_id, response_id), request,
                                   response_id)

    async def create_response(self, request: Request) -> Response:
        body = await self._stoppable(self.read_json(request, ResponsesRequest))
        self.chat.check_model(body.model)
        self._apply_options(body.chat)
        response_id, engine_id = response_and_engine_ids(
            "resp", request.headers.get("x-request-id"), body.request_id)
        if body.stream:
            cs, events = self.responses.new_stream(body, response_id)
            started = await self._stoppable(self.responses.start(body, engine_id, cs))
            return self._event_stream(
                self.responses.stream(started, cs, events), [engine_id], response_id,
                stop_frames=lambda: [events.error(shutting_down_error(
                    "; the response is incomplete"))])
        return await self._respond(self.responses.create(body, engine_id, response_id),
                                   request, response_id)

    async def retrieve_response(self, request: Request) -> Response:
        """GET, DELETE and POST .../cancel of a stored response (vLLM's routes): none is."""
        raise NotFoundError("this server keeps no responses (there is no response store).",
                            param="response_id")

    def _apply_options(self, body: SamplingRequest) -> None:
        options = self.chat.options
        body.apply_server_defaults(options.return_tokens_as_token_ids,
                                   options.enable_force_include_usage)
        if isinstance(body, ChatCompletionRequest):
            body.chat_template_kwargs = template_kwargs_with_defaults(
                self.chat.default_chat_template_kwargs, body.chat_template_kwargs)

    async def _stoppable(self, work: Awaitable[T]) -> T:
        """``work`` (before the response starts), cut short by the shutdown deadline."""
        try:
            return await run_until_disconnect(work, None, self.lifecycle.stop)
        except ServerStopping:
            raise shutting_down_error() from None

    async def _respond(self, work: Awaitable[BaseModel], request: Request, rid: str) -> Response:
        try:
            result = await run_until_disconnect(work, request.receive, self.lifecycle.stop)
        except ClientDisconnected:
            # The work was cancelled and its requests aborted; nobody will read an answer.
            raise ClientDisconnected(
                f"before the response was complete; request {rid} was aborted"
            ) from None
        except ServerStopping:
            raise shutting_down_error("; the request was not completed") from None
        return await json_response(result)

    def _event_stream(
        self, frames: AsyncIterator[str], request_ids: list[str], label: str,
        stop_frames: Callable[[], list[str]] | None = None,
    ) -> EventStreamResponse:
        return EventStreamResponse(
            frames,
            on_close=lambda: self.completions.abort(request_ids),
            stop=self.lifecycle.stop,
            stop_frames=stop_frames or (lambda: [
                shutting_down_error("; the response is incomplete").sse_frame(),
                DONE_FRAME,
            ]),
            label=label,
        )

    async def show_models(self, request: Request) -> Response:
        return JSONResponse(ModelList(data=self._cards()).model_dump(mode="json"))

    async def show_model(self, request: Request) -> Response:
        """OpenAI's model retrieval (``client.models.retrieve``): one served name's card."""
        name = request.path_params["model"]
        card = next((c for c in self._cards() if c.id == name), None)
        if card is None:
            return NotFoundError(f"The model `{name}` does not exist.", param="model").response()
        return JSONResponse(card.model_dump(mode="json"))

    def _cards(self) -> list[ModelCard]:
        return [ModelCard(id=name, root=self.engine.model_name,
                          max_model_len=self.engine.max_model_len) for name in self.model_names]

    async def health(self, request: Request) -> Response:
        if not self.lifecycle.accepting:
            return shutting_down_error().response()
        problem = self.watchdog.problem()
        if problem is not None:
            return ServiceUnavailableError(problem, None).response()
        return Response(status_code=200)

    async def tokenize(self, request: Request) -> Response:
        return await self._tokenizer_route(request, self.tokenization.tokenize)

    async def detokenize(self, request: Request) -> Response:
        return await self._tokenizer_route(request, self.tokenization.detokenize)

    async def _tokenizer_route(self, request: Request,
                               work: Callable[[dict[str, Any]], BaseModel]) -> Response:
        raw = await self._stoppable(
            read_body(request, self.max_request_body_bytes, self.body_read_timeout))
        # The tokenizer is the input thread's: never on the loop, never two at once.
        result = await self.engine.run_in_executor(_tokenizer_call, work, raw,
                                                   self.completions.check_model)
        return JSONResponse(result.model_dump(mode="json", exclude_none=True))

    async def openapi(self, request: Request) -> Response:
        if self._openapi is None:
            import json

            doc = openapi_document("cadence", cadence_version(), API_OPERATIONS)
            self._openapi = json.dumps(doc).encode()
        return Response(self._openapi, media_type="application/json")

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": cadence_version()})

    async def _refresh_stats(self) -> None:
        """Fresh scheduler stats for a scrape. While this front end has requests in the engine,
        every step's outputs bring them; otherwise they are asked for, answered between two
        steps, and a step that runs long (a large prefill, other front ends' requests) holds
        the answer up to ``STATS_WAIT_S``: past it the last figures are served. One request for
        them is out at a time; it is never cancelled, and a late answer is still recorded."""
        engine = self.engine
        if engine.errored or engine.has_unfinished_requests():
            return
        task = self._stats_refresh
        if task is None or task.done():
            task = self._stats_refresh = asyncio.ensure_future(engine.do_log_stats())
            task.add_done_callback(_stats_refreshed)
        await asyncio.wait({task}, timeout=STATS_WAIT_S)

    async def metrics_endpoint(self, request: Request) -> Response:
        """Prometheus text (OpenMetrics where the scrape's Accept asks), gzipped where its
        Accept-Encoding takes gzip: prometheus_client's own exposition rules."""
        await self._refresh_stats()
        body, content_type = self.metrics.exposition(request.headers.get("accept"))
        headers = {}
        if gzip_accepted(request.headers.get("accept-encoding", "")):
            body = gzip.compress(body)
            headers["content-encoding"] = "gzip"
        return Response(body, headers=headers, media_type=content_type)

    async def stats(self, request: Request) -> Response:
        raw_since = request.query_params.get("since", "-1")
        try:
            since = int(raw_since)
        except ValueError:
            raise BadRequestError(f"since must be an integer (a second), got {raw_since!r}.",
                                  "since") from None
        await self._refresh_stats()
        problem = (None if self.lifecycle.accepting else "shutting down") or self.watchdog.problem()
        if since < 0 and self._config_summary is None:  # what does not change, asked once
            self._config_summary = engine_config_summary(self.engine, self.model_name)
        body = stats_document(self.seconds, problem or "serving", cadence_version(), since,
                              self._config_summary if since < 0 else None)
        return JSONResponse(body, headers={"cache-control": "no-store"})


def _stats_refreshed(task: asyncio.Future[None]) -> None:
    # The engine died during the refresh: the scrape served the figures it had.
    if not task.cancelled() and task.exception() is not None:
        logger.warning("Could not refresh scheduler stats: %s", task.exception())


def _tokenizer_call(work: Callable[[dict[str, Any]], BaseModel], raw: bytes,
                    check_model: Callable[[str | None], None]) -> BaseModel:
    data = parse_json_body(raw)
    if not isinstance(data, dict):
        raise BadRequestError("The request body must be a JSON object.", None)
    model = data.get("model")
    check_model(model if isinstance(model, str) else None)
    try:
        return work(data)  # a ParamError becomes a 400 through the app's handler
    except ValidationError as exc:
        raise from_validation_error(exc) from exc


def build_app(
    engine: AsyncLLM,
    *,
    served_model_name: str | Sequence[str] | None = None,
    api_key: str | Sequence[str] | None = None,
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
    body_read_timeout: float = DEFAULT_BODY_READ_TIMEOUT_S,
    engine_stall_timeout: float = DEFAULT_ENGINE_STALL_TIMEOUT_S,
    front_end_index: int | None = None,
    chat_template: str | None = None,
    web_page: bool = True,
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = None,
    trust_request_chat_template: bool = False,
    responses: ResponseOptions = ResponseOptions(),
    chat_template_content_format: str = "auto",
    default_chat_template_kwargs: Mapping[str, Any] | None = None,
) -> Starlette:
    """The application serving ``engine``; the caller owns the engine's lifetime.
    ``front_end_index``: this is one of several API server processes (``--api-server-count``).
    ``api_key``: a key or several that ``/v1`` routes require (any one of them).

    ``app.state.server`` is the ``OpenAIServer``: a launcher drives its ``lifecycle`` on
    shutdown and polls its ``watchdog`` while serving. ``web_page``: serve the browser page at
    ``/`` (``cadence.server.web_page``)."""
    server = OpenAIServer(
        engine,
        served_model_name=served_model_name,
        max_request_body_bytes=max_request_body_bytes,
        body_read_timeout=body_read_timeout,
        engine_stall_timeout=engine_stall_timeout,
        front_end_index=front_end_index,
        chat_template=chat_template,
    )
    server.chat.reasoning = reasoning_parser_named(reasoning_parser)
    server.completions.reasoning_tags = server.chat.reasoning_tags
    server.chat.tool_call_parser = tool_call_parser
    server.chat.trust_request_chat_template = trust_request_chat_template
    server.chat.options = server.completions.options = responses
    server.tokenization.trust_request_chat_template = trust_request_chat_template
    server.chat.content_format = server.tokenization.content_format = (
        chat_template_content_format)
    server.chat.default_chat_template_kwargs = default_chat_template_kwargs
    server.tokenization.default_chat_template_kwargs = default_chat_template_kwargs
    routes = [
        Route("/v1/completions", server.create_completion, methods=["POST"]),
        Route("/v1/chat/completions", server.create_chat_completion, methods=["POST"]),
        Route("/v1/responses", server.create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}/cancel", server.retrieve_response,
              methods=["POST"]),
        Route("/v1/responses/{response_id:path}", server.retrieve_response,
              methods=["GET", "DELETE"]),
        Route("/v1/models", server.show_models, methods=["GET"]),
        Route("/v1/models/{model:path}", server.show_model, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/ping", server.health, methods=["GET", "POST"]),
        Route("/tokenize", server.tokenize, methods=["POST"]),
        Route("/detokenize", server.detokenize, methods=["POST"]),
        Route("/openapi.json", server.openapi, methods=["GET"]),
        Route("/version", server.version, methods=["GET"]),
        Route("/metrics", server.metrics_endpoint, methods=["GET"]),
        Route("/stats", server.stats, methods=["GET"]),
    ]
    routes += profile_routes(engine)
    if web_page:
        routes.append(Route("/", WebPage().serve, methods=["GET"]))
    app = Starlette(
        routes=routes,
        exception_handlers=exception_handlers(),
    )
    app.add_middleware(UnexpectedErrorMiddleware)  # innermost: next to the routes' handlers
    app.add_middleware(InFlightMiddleware, lifecycle=server.lifecycle)
    if keys := api_keys(api_key):  # checked first
        app.add_middleware(ApiKeyMiddleware, keys=keys)
    if responses.enable_request_id_headers:  # outermost: a 401 carries the id too
        app.add_middleware(RequestIdHeaderMiddleware)
    app.state.server = server
    return app
