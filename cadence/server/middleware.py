"""What ``cadence serve`` puts around the application: the API key, CORS, a proxy's path prefix
and request-id headers (vLLM's ``--api-key``, ``--allowed-origins`` ... ``--allow-credentials``,
``--root-path`` and ``--enable-request-id-headers``)."""

from __future__ import annotations

import hashlib
import hmac
import ssl
import uuid
from collections.abc import Sequence

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cadence.server.errors import AuthenticationError, NotFoundError
from cadence.server.settings import ServerSettings

__all__ = ["KEY_PROTECTED_PATHS", "ApiKeyMiddleware", "RequestIdHeaderMiddleware",
           "RootPathMiddleware", "api_keys", "check_ssl_files", "route_path", "wrap_app"]


# Besides every /v1 route, the routes that tell what the server runs and does, and those that
# change how the engine runs.
KEY_PROTECTED_PATHS = frozenset({"/stats", "/start_profile", "/stop_profile"})


def api_keys(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """The keys a server requires: none for None, one for a string, each of a sequence. An
    empty key is refused here, where the server is built (it cannot mean "no key")."""
    if value is None:
        return ()
    keys = (value,) if isinstance(value, str) else tuple(value)
    if not all(isinstance(k, str) and k.strip() for k in keys):
        raise ValueError("api_key: a key must be a non-blank string.")
    return keys


class ApiKeyMiddleware:
    """Require ``Authorization: Bearer <key>`` with any of ``keys`` (several for key
    rotation, as vLLM's ``--api-key A B``) on every ``/v1`` route and on ``KEY_PROTECTED_PATHS``
    (pure ASGI)."""

    def __init__(self, app: ASGIApp, keys: str | Sequence[str]) -> None:
        if not (checked := api_keys(keys)):
            raise ValueError("api_key: at least one key.")
        self.app = app
        self.expected = tuple(hashlib.sha256(key.encode()).digest() for key in checked)

    def _authorized(self, scope: Scope) -> bool:
        """The request's first ``Authorization`` header (the one Starlette and proxies read)
        is ``Bearer <a key>``, the scheme in any case (RFC 9110's rule, vLLM's)."""
        given = next((value for name, value in scope.get("headers") or []
                      if name == b"authorization"), b"")
        scheme, _, token = given.partition(b" ")
        # NOTE: digests of equal length are compared, every key (no early exit), so the time
        # tells neither a key's length nor which key a guess came close to.
        digest = hashlib.sha256(token).digest()
        matches = [hmac.compare_digest(digest, expected) for expected in self.expected]
        return scheme.lower() == b"bearer" and any(matches)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = route_path(scope)
        if scope["type"] == "http" and (path.startswith("/v1") or path in KEY_PROTECTED_PATHS):
            if not self._authorized(scope):
                err = AuthenticationError("Unauthorized: a valid API key is required.", None)
                response = err.response()
                response.headers["www-authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class RequestIdHeaderMiddleware:
    """Every HTTP response carries ``X-Request-Id``: the request's own header, else a new id
    (vLLM's ``--enable-request-id-headers``; pure ASGI, streamed responses included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # The first of repeated headers, as the routes read it (Starlette's headers.get).
        given = next((v for k, v in scope.get("headers") or [] if k == b"x-request-id"), None)
        request_id = given if given else uuid.uuid4().hex.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-request-id", request_id)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def route_path(scope: Scope) -> str:
    """The path the router matches: ``path`` less a ``root_path`` it starts with (Starlette's
    rule), so that the key is checked on exactly the route that will answer."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root):]
    return path


class RootPathMiddleware:
    """Serve behind a proxy that routes ``root_path`` to this server (FastAPI's ``root_path``,
    which vLLM sets): the prefix goes into the scope's ``root_path``, and the ``path`` carries it
    whether the proxy stripped it or not (ASGI's rule, from which Starlette builds the URLs it
    answers with, e.g. a trailing-slash redirect); the routes and the API-key check match the
    path less the prefix (``route_path``) either way."""

    def __init__(self, app: ASGIApp, root_path: str) -> None:
        self.app = app
        self.root_path = root_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            root, path = self.root_path, scope["path"]
            if path == root or path.startswith(root + "/"):
                path = path[len(root):] or "/"
            if path == root or path.startswith(root + "/"):
                # The prefix twice (/llm/llm/v1/...): the router would strip it once more and
                # answer a route the API-key check did not see. No route is there.
                await NotFoundError(f"No route for {scope['path'][:200]!r}.").response()(
                    scope, receive, send)
                return
            prefix = scope.get("root_path", "") + root
            scope = {**scope, "root_path": prefix, "path": prefix + path}
        await self.app(scope, receive, send)


def wrap_app(app: ASGIApp, settings: ServerSettings) -> ASGIApp:
    """``app`` inside CORS (always, with vLLM's allow-all defaults, so that preflights are
    answered before the API-key check), inside the root-path prefix when there is one."""
    wrapped: ASGIApp = CORSMiddleware(
        app,
        allow_origins=list(settings.allowed_origins),
        allow_methods=list(settings.allowed_methods),
        allow_headers=list(settings.allowed_headers),
        allow_credentials=settings.allow_credentials,
    )
    if settings.root_path:
        wrapped = RootPathMiddleware(wrapped, settings.root_path)
    return wrapped


def check_ssl_files(settings: ServerSettings) -> None:
    """Load the certificate and key as uvicorn will, before the model loads, so that a wrong
    path or a key that does not match is a one-line error at once (``ValueError``)."""
    if settings.ssl_certfile is None:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile)
    except OSError as exc:  # ssl.SSLError included
        files = settings.ssl_certfile + (f", {settings.ssl_keyfile}" if settings.ssl_keyfile
                                         else "")
        if isinstance(exc, ssl.SSLError):
            reason = f"not a PEM certificate with its private key (OpenSSL: {exc.reason or exc})"
        else:
            reason = exc.strerror or str(exc)
        raise ValueError(f"--ssl-certfile/--ssl-keyfile: cannot load {files}: {reason}") from None
