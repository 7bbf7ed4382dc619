"""A large answer's JSON body built a piece at a time, the event loop given a turn between.

A non-streamed answer of many choices with logprobs (``n`` 128, 400 tokens, 20 top logprobs:
72 MB) took the loop for seconds to dump and encode at once, and ``/health`` with every stream
waited. Each choice is dumped and encoded apart here, into the bytes Starlette's
``JSONResponse`` would have rendered for the whole.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

__all__ = ["json_response", "render"]


def render(value: Any) -> str:
    """``value`` as ``JSONResponse`` renders it (compact, UTF-8 as is, no NaN)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":"))


async def json_response(model: BaseModel, parts: str = "choices") -> Response:
    """``JSONResponse(model.model_dump(mode="json"))``'s body, with each item of the list field
    ``parts`` dumped and encoded apart and the loop given a turn after each."""
    items = getattr(model, parts, None)
    if not isinstance(items, list) or len(items) < 2:
        return JSONResponse(model.model_dump(mode="json"))
    head = model.model_dump(mode="json", exclude={parts})
    fields = list(type(model).model_fields)
    after = set(fields[fields.index(parts) + 1:])  # the fields the list goes before
    pieces: list[str] = []
    listed = False
    for key, value in head.items():
        if not listed and key in after:
            pieces.append(await _list_piece(parts, items))
            listed = True
        pieces.append(render(key) + ":" + render(value))
    if not listed:
        pieces.append(await _list_piece(parts, items))
    return Response(("{" + ",".join(pieces) + "}").encode("utf-8"),
                    media_type="application/json")


async def _list_piece(name: str, items: list[BaseModel]) -> str:
    rendered = []
    for item in items:
        rendered.append(render(item.model_dump(mode="json")))
        await asyncio.sleep(0)  # NOTE: a turn for the loop between choices
    return render(name) + ":[" + ",".join(rendered) + "]"
