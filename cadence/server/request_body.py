"""Reading a request body and parsing it as JSON: every failure is a 4xx, never a 500.

What can be refused from the headers alone (a non-JSON ``Content-Type`` or a compressed body,
``Content-Encoding`` other than identity: 415; a declared length over the limit: 413) is
refused before the body is read, so that a client sending ``Expect: 100-continue`` never gets
``100 Continue`` (the server sends it on the first read). The whole body must arrive within a
deadline (408 otherwise); a client that leaves mid-upload raises ``ClientDisconnected``.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from cadence.chat import encodes_as_utf8
from cadence.server.errors import (
    BadRequestError,
    RequestTimeoutError,
    RequestTooLargeError,
    UnsupportedMediaTypeError,
    from_validation_error,
)
from cadence.server.protocol import ParamError
from cadence.server.sse import ClientDisconnected

__all__ = ["check_content_encoding", "check_json_content_type", "parse_json_body", "read_body",
           "validate_request"]

M = TypeVar("M", bound=BaseModel)

_CLOSE = {"connection": "close"}
# A JSON string escape of a UTF-16 surrogate; a lone one decodes to a str that cannot be encoded.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def check_json_content_type(value: str | None) -> None:
    """``application/json`` (any parameters) or a ``+json`` type; a missing header is accepted
    (clients that post JSON without saying so are common)."""
    if value is None:
        return
    media_type = value.split(";", 1)[0].strip().lower()
    if media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        return
    raise UnsupportedMediaTypeError(
        f"Unsupported Content-Type {value[:100]!r}: the request body must be application/json.",
        None,
    )


def check_content_encoding(value: str | None) -> None:
    """No content coding (or ``identity``): a compressed body is refused with 415 (RFC 9110),
    not parsed as JSON, which would fail with a confusing message or, for a plain body labelled
    as compressed, succeed on a body the client did not describe."""
    if value is None:
        return
    codings = [c.strip().lower() for c in value.split(",") if c.strip()]
    if all(c == "identity" for c in codings):
        return
    raise UnsupportedMediaTypeError(
        f"Unsupported Content-Encoding {value[:100]!r}: the request body must not be "
        "compressed.",
        None,
    )


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The request body, at most ``limit`` bytes, received within ``timeout`` seconds."""
    headers = request.headers
    expects_continue = headers.get("expect", "").lower() == "100-continue"
    # Refused before reading: with Expect the client has sent nothing and waits, so close;
    # otherwise the server discards what still comes, and the client reads the answer.
    early_headers = _CLOSE if expects_continue else None
    try:
        check_json_content_type(headers.get("content-type"))
        check_content_encoding(headers.get("content-encoding"))
    except UnsupportedMediaTypeError as exc:
        exc.headers = early_headers
        raise
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit, early_headers)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    body = bytearray()
    while True:
        remaining = deadline - loop.time()
        try:
            if remaining <= 0:
                raise asyncio.TimeoutError
            message = await asyncio.wait_for(request.receive(), remaining)
        except asyncio.TimeoutError:
            raise RequestTimeoutError(
                f"The request body was not received within {timeout:g} s.", None, headers=_CLOSE
            ) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnected("while sending the request body")
        body += message.get("body", b"")
        if len(body) > limit:
            raise _too_large(limit, None)
        if not message.get("more_body", False):
            return bytes(body)


def _too_large(limit: int, headers: dict[str, str] | None) -> RequestTooLargeError:
    return RequestTooLargeError(
        f"Request body too large: the limit is {limit} bytes.", None, headers=headers
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_body(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object; anything else is a 400 (never a 500)."""
    try:
        # Strict UTF-8 (a leading BOM allowed): json.loads of bytes would also take UTF-16 and
        # UTF-8-encoded lone surrogates, which no tokenizer or response encoder can take.
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadRequestError(
            f"Invalid JSON in request body: not UTF-8 (byte {exc.start}: {exc.reason}).", None
        ) from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise BadRequestError("Invalid JSON in request body: nested too deeply.", None) from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the int digit limit
        reason = str(exc)
        if "int_max_str_digits" in reason:  # Python's own advice is not the client's to take
            reason = f"an integer has more than {sys.get_int_max_str_digits()} digits"
        raise BadRequestError(f"Invalid JSON in request body: {reason}", param=None) from exc
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
            if not encodes_as_utf8(item):
                raise BadRequestError(
                    f"{where or 'body'}: invalid Unicode (a lone surrogate) in a string.",
                    where or None,
                )
        elif isinstance(item, dict):
            for key, sub in item.items():
                if not encodes_as_utf8(key):
                    raise BadRequestError(
                        f"{where or 'body'}: invalid Unicode (a lone surrogate) in a key.",
                        where or None,
                    )
                stack.append((sub, f"{where}.{key}" if where else key))
        elif isinstance(item, list):
            stack.extend((sub, f"{where}.{i}") for i, sub in enumerate(item))


def validate_request(body: bytes, model: type[M]) -> tuple[M, set[str]]:
    """The validated request, and the names of the top-level fields it ignored."""
    data = parse_json_body(body)
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc) from exc
    try:
        parsed.check()  # type: ignore[attr-defined]
    except ParamError as exc:
        raise BadRequestError(str(exc), exc.param) from exc
    known = model.model_fields.keys()
    unknown = {k for k in data if k not in known} if isinstance(data, dict) else set()
    return parsed, unknown
