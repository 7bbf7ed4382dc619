"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from pydantic import ValidationError
from starlette.responses import Response

# A message may quote the client's input (a model name, a key, a list of ids): past this many
# characters the quote is cut, so a megabyte of input never comes back as a megabyte of error.
MAX_MESSAGE_CHARS = 2048


def _bounded(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    kept = limit - 40
    return f"{text[:kept]}... ({len(text) - kept} more characters)"


class APIError(Exception):
    """An error answered to the client; ``type`` is the error class name, as vLLM sends it."""

    status_code: int = HTTPStatus.INTERNAL_SERVER_ERROR
    type: str = "InternalServerError"

    def __init__(
        self, message: str, param: str | None = None, *, headers: dict[str, str] | None = None
    ) -> None:
        message, param = _bounded(message, MAX_MESSAGE_CHARS), param and _bounded(param, 256)
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": int(self.status_code),
            }
        }

    def sse_frame(self) -> str:
        return f"data: {json.dumps(self.body())}\n\n"

    def response(self) -> Response:
        # ASCII-escaped: a message may echo user text, which must never fail to encode.
        return Response(
            json.dumps(self.body()).encode("ascii"),
            status_code=int(self.status_code),
            media_type="application/json",
            headers=self.headers,
        )


class BadRequestError(APIError):
    status_code = HTTPStatus.BAD_REQUEST
    type = "BadRequestError"


class AuthenticationError(APIError):
    status_code = HTTPStatus.UNAUTHORIZED
    type = "AuthenticationError"


class NotFoundError(APIError):
    status_code = HTTPStatus.NOT_FOUND
    type = "NotFoundError"


class RequestTooLargeError(APIError):
    status_code = HTTPStatus.REQUEST_ENTITY_TOO_LARGE
    type = "RequestTooLargeError"


class RequestTimeoutError(APIError):
    status_code = HTTPStatus.REQUEST_TIMEOUT
    type = "RequestTimeoutError"


class HeaderFieldsTooLargeError(APIError):
    status_code = HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
    type = "RequestHeaderFieldsTooLargeError"


class UnsupportedMediaTypeError(APIError):
    status_code = HTTPStatus.UNSUPPORTED_MEDIA_TYPE
    type = "UnsupportedMediaTypeError"


class InternalServerError(APIError):
    pass


class ServiceUnavailableError(APIError):
    status_code = HTTPStatus.SERVICE_UNAVAILABLE
    type = "ServiceUnavailableError"


def from_validation_error(exc: ValidationError) -> BadRequestError:
    """The first schema error, naming its field (dotted path, list indices included)."""
    first, path = chosen_error(exc)
    param = ".".join(path) or None
    msg = first.get("msg", "invalid value")
    value = first.get("input")
    detail = f"{param}: {msg}" if param else msg
    if param and first.get("type") != "missing" and _short(value):
        detail += f" (got {value!r})"
    return BadRequestError(detail, param)


def chosen_error(exc: ValidationError) -> tuple[Any, list[str]]:
    """The error to report of a schema's errors, and its field path."""
    errors = exc.errors()
    paths = [_field_path(e) for e in errors]
    # A union reports once per member. Of the errors under the first one's field, the member
    # the input was meant for is the one whose errors reach deepest (the input had its outer
    # shape: a list's bad element, not "should be a valid string"), then the one with the
    # fewest errors; its first error is reported.
    members = [_member(e) for e in errors]
    head = paths[0]
    under = [i for i, p in enumerate(paths) if p[: len(head)] == head]
    reach: dict[tuple[tuple[int, str], ...], int] = {}
    for i in under:
        reach[members[i]] = max(reach.get(members[i], 0), len(paths[i]))
    best = min(under, key=lambda i: (-reach[members[i]], members.count(members[i]), i))
    return errors[best], paths[best]


_PYDANTIC_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "function-after"}


def _is_field(part: str) -> bool:
    # A union member's tag is a type: a builtin's name, a model's CamelCase class name, or a
    # parametrized type ("list[int]", "literal['a']"); fields and keys are snake_case or indices.
    return ((part.isidentifier() and not part[:1].isupper()) or part.isdigit()) \
        and part not in _PYDANTIC_TYPE_TAGS


def _field_path(error: Any) -> list[str]:
    # Union members show up as extra path parts ("str", "list[int]"): keep the field path.
    return [p for p in map(str, error.get("loc", ())) if _is_field(p)]


def _member(error: Any) -> tuple[tuple[int, str], ...]:
    """Which union members (at which places of the path) an error was found under."""
    return tuple((i, p) for i, p in enumerate(map(str, error.get("loc", ()))) if not _is_field(p))


def _short(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool)) and len(repr(value)) <= 80
