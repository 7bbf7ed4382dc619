"""GET /openapi.json: the server's OpenAPI 3.1 document, generated from its pydantic models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

__all__ = ["Operation", "openapi_document"]


@dataclass(frozen=True)
class Operation:
    path: str
    method: str
    summary: str
    request: type[BaseModel] | tuple[type[BaseModel], ...] | None = None
    response: type[BaseModel] | None = None
    streams: bool = False  # may answer text/event-stream (``"stream": true``)


def openapi_document(title: str, version: str, operations: list[Operation]) -> dict[str, Any]:
    models: list[type[BaseModel]] = []
    for op in operations:
        requests = op.request if isinstance(op.request, tuple) else (op.request,)
        for m in (*requests, op.response):
            if m is not None and m not in models:
                models.append(m)
    refs, defs = models_json_schema([(m, "validation") for m in models],
                                    ref_template="#/components/schemas/{model}")

    def ref(model: type[BaseModel]) -> dict[str, Any]:
        return refs[(model, "validation")]

    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        entry: dict[str, Any] = {"summary": op.summary, "responses": {}}
        if op.request is not None:
            requests = op.request if isinstance(op.request, tuple) else (op.request,)
            schema = ref(requests[0]) if len(requests) == 1 else {
                "anyOf": [ref(m) for m in requests]}
            entry["requestBody"] = {"required": True,
                                    "content": {"application/json": {"schema": schema}}}
        content: dict[str, Any] = {}
        if op.response is not None:
            content["application/json"] = {"schema": ref(op.response)}
        if op.streams:
            content["text/event-stream"] = {"schema": {"type": "string"}}
        entry["responses"]["200"] = {"description": "OK", **({"content": content} if content
                                                             else {})}
        entry["responses"]["4XX"] = {"description": "an OpenAI-style error object naming the "
                                                    "parameter at fault"}
        paths.setdefault(op.path, {})[op.method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {"schemas": defs.get("$defs", {})},
    }
