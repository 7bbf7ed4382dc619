"""Shared by the tool-call and reasoning tests: a parser fed an answer in random stream
pieces, and a server whose engine answers a scripted text (``ScriptedCore``)."""

from __future__ import annotations

import random
from typing import Any

from cadence.server.tool_calls import ParsedCall, tool_call_stream


def feed_in_pieces(parser: str, text: str, seed: int, max_cuts: int = 10
                   ) -> tuple[str, list[ParsedCall], Any]:
    """(content shown, calls, the stream) of ``text`` fed to ``parser``'s stream in random
    pieces (the last one final)."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text), rng.randrange(0, max_cuts))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    stream = tool_call_stream(parser)
    shown, got = "", []
    for i, piece in enumerate(pieces):
        c, new = stream.feed(piece, final=i == len(pieces) - 1)
        shown += c
        got.extend(new)
    if not pieces:
        c, new = stream.feed("", final=True)
        shown, got = shown + c, got + new
    return shown, got, stream


def scripted_server(server_factory: Any, text: str, **app_kwargs: Any) -> tuple[Any, int]:
    """A server whose engine answers every request with ``text`` (the tiny tokenizer's
    tokens); (the server, the answer's token count)."""
    from transformers import AutoTokenizer

    from cadence.model.tiny import ensure_tiny_model
    from tests.server.test_tool_calls import ScriptedCore

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    ScriptedCore.SCRIPT = tok.encode(text, add_special_tokens=False)
    srv = server_factory(core_factory=ScriptedCore, app_kwargs=app_kwargs)
    return srv, len(ScriptedCore.SCRIPT)


def streamed_calls(client: Any, kw: dict[str, Any]) -> tuple[str, list[Any]]:
    """(content, tool-call deltas) of a streamed chat completion of one choice."""
    calls: list[Any] = []
    content = ""
    for chunk in client.chat.completions.create(**kw, stream=True):
        if chunk.choices:
            calls.extend(chunk.choices[0].delta.tool_calls or [])
            content += chunk.choices[0].delta.content or ""
    return content, calls

