"""vLLM's ``--tool-call-parser pythonic`` (Llama 3.2 and 4, and other models whose templates ask
for Python call syntax): an answer that is a Python list of calls with keyword arguments,

    [get_weather(city="Paris", days=2), get_time(zone="CET")]

(Llama 4's ``<|python_start|>`` / ``<|python_end|>`` around it allowed) is those calls, each
argument a literal (string, number, boolean, None, list, dict; JSON's ``true``, ``false`` and
``null`` too, which some models write) and the arguments JSON text, a dotted callee
(``weather.get(...)``) named with its dots, as vLLM's parser reads them; any
other answer (text after the list too, as vLLM's parser has it), or one that does not parse
so, is content whole. Streamed, an answer that may be such a list is held to its end (the calls
then go out whole, or it is content); one that cannot be (it does not open with ``[`` and a
name) streams as content at once.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from cadence.server.tool_call_json import NotJson, ParsedCall, dumps_json, is_name, new_call

__all__ = ["PythonicCallStream", "parse_pythonic"]

START, END = "<|python_start|>", "<|python_end|>"
# The start of a list of calls: "[" then a (dotted) name and "(" (a prefix of that while it
# grows).
_NAME = r"[A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)*"
_OPENING = re.compile(rf"\s*\[\s*{_NAME}\s*\(")
# NOTE: no two parts may match the same blanks (a dot-leader line would then backtrack
# exponentially on the event loop): names joined by dots, then at most one trailing dot.
_OPENING_PREFIX = re.compile(rf"\s*(?:\[\s*(?:{_NAME}(?:\s*\.)?\s*)?)?")
_JSON_NAMES = {"true": True, "false": False, "null": None}
_MAX_SOURCE = 1 << 20  # characters: the parser's input stays bounded


def _unwrapped(text: str) -> str:
    body = text.strip()
    if body.startswith(START):
        body = body[len(START):]
        if body.rstrip().endswith(END):
            body = body.rstrip()[: -len(END)]
    return body.strip()


class _JsonNames(ast.NodeTransformer):
    """JSON's true / false / null written as names: the constants they mean."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in _JSON_NAMES:
            return ast.copy_location(ast.Constant(_JSON_NAMES[node.id]), node)
        return node


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(_JsonNames().visit(node))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise NotJson("not a literal") from None


def _callee(node: ast.expr) -> str | None:
    """A call's function name: a name, or names joined by dots (``weather.get``)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def parse_pythonic(text: str) -> list[ParsedCall] | None:
    """The calls of ``text`` when it is a whole list of keyword-argument calls, else None."""
    body = _unwrapped(text)
    if not body.startswith("[") or not body.endswith("]") or len(body) > _MAX_SOURCE:
        return None
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    try:
        for node in tree.elts:
            name = _callee(node.func) if isinstance(node, ast.Call) else None
            if (name is None or node.args or any(k.arg is None for k in node.keywords)
                    or not is_name(name)):
                return None
            args = {k.arg: _literal(k.value) for k in node.keywords}
            calls.append(new_call(name, dumps_json(args)))
    except NotJson:
        return None
    return calls


def _may_open_calls(text: str) -> bool:
    """Whether ``text`` (the answer so far) may still become a list of calls."""
    body = text.lstrip()
    if body.startswith(START):
        body = body[len(START):]
    elif START.startswith(body):
        return True  # blanks, or the start of Llama 4's tag
    if _OPENING.match(body):
        return True
    # A prefix of the opening: "[", "[ get", "[get_weather", "[weather." (no "(" yet).
    return _OPENING_PREFIX.fullmatch(body) is not None


class PythonicCallStream:
    """The streamed form of ``parse_pythonic``: ``feed`` as ``ToolCallStream.feed``."""

    def __init__(self) -> None:
        self.text = ""
        self.mode: str | None = None  # None: may be calls; "content"; "after": calls sent
        self.calls: list[ParsedCall] = []
        self.cut_call = False  # the answer ended inside what may have been calls

    def feed(self, piece: str, final: bool = False) -> tuple[str, list[ParsedCall]]:
        if self.mode == "content":
            return piece, []
        if self.mode == "after":
            return "", []
        self.text += piece
        if final:  # NOTE: the list must be the whole answer: text may follow its "]"
            calls = parse_pythonic(self.text)
            if calls is not None:
                self.mode, self.text = "after", ""
                self.calls.extend(calls)
                return "", calls
        if final or not _may_open_calls(self.text):
            self.cut_call = final and _OPENING.match(_unwrapped(self.text)) is not None
            self.mode, text, self.text = "content", self.text, ""
            return text, []
        return "", []
