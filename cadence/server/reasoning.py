"""Reasoning output kept apart from the answer (vLLM's ``--reasoning-parser``).

A parser splits a model's text at its ``<think> ... </think>`` tags into ``reasoning`` and
``content``, whole (a finished answer) or as it streams (``ReasoningStream``: text that may be
the start of a tag is held back until the next piece shows what it is).

Both parsers (current vLLM's): the output is reasoning up to ``</think>`` (an opening
``<think>`` it starts with, after blanks, is dropped: older templates let the model open the tag,
newer ones open it in the prompt), the rest content; without ``</think>`` it is all reasoning (it
ran out of tokens thinking). When the prompt already closed the reasoning (its last tag is
``</think>``: a template that turned thinking off), or ``qwen3`` with ``enable_thinking: false``,
the whole output is content (``reasoning_ended``). The grammar of a structured output follows
the same rule (``cadence.worker.grammar.reasoning_open``).

Usage counts the reasoning's tokens (``ReasoningCount``, ``reasoning_tokens``): with the tags as
single tokens, vLLM's count by their ids; where the tokenizer splits them, the tokens whose text
holds some of the reasoning.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cadence.config import REASONING_TAGS
from cadence.server.held_text import tag_prefix_len

__all__ = ["REASONING_PARSERS", "ReasoningCount", "ReasoningParser", "ReasoningStream",
           "reasoning_parser", "reasoning_span", "reasoning_tokens"]

START, END = REASONING_TAGS["qwen3"]  # every parser's (cadence.config)


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    # The chat template option that turns thinking off (the whole output is then content).
    switch: str | None = None

    @property
    def tags(self) -> tuple[str, str]:
        return START, END

    def thinking_off(self, chat_template_kwargs: Mapping[str, Any] | None) -> bool:
        return self.switch is not None and (chat_template_kwargs or {}).get(self.switch) is False

    def split(self, text: str, reasoning_ended: bool = False
              ) -> tuple[str | None, str | None]:
        """(reasoning, content) of a whole output; None where a part is empty, except that an
        output without reasoning keeps its content even when empty ("", as without a parser
        and as the stream's content delta)."""
        reasoning, content = self.stream(reasoning_ended).feed(text, final=True)
        if not reasoning:
            return None, content
        return reasoning, content or None

    def stream(self, reasoning_ended: bool = False) -> ReasoningStream:
        return ReasoningStream(self, reasoning_ended)


REASONING_PARSERS = {
    "qwen3": ReasoningParser("qwen3", switch="enable_thinking"),
    "deepseek_r1": ReasoningParser("deepseek_r1"),
}
assert set(REASONING_PARSERS) == set(REASONING_TAGS)  # the engine knows every parser's tags


def reasoning_parser(name: str | None) -> ReasoningParser | None:
    if name is None:
        return None
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(
            f"--reasoning-parser {name!r} is not known; use one of "
            f"{', '.join(sorted(REASONING_PARSERS))}."
        ) from None


class ReasoningStream:
    """Splits streamed text pieces into (reasoning delta, content delta)."""

    def __init__(self, parser: ReasoningParser, reasoning_ended: bool = False) -> None:
        self.parser = parser
        # "start": nothing out yet (an opening tag may come); "reasoning": up to the end tag;
        # "content": after it (or the prompt ended the reasoning).
        self.state = "content" if reasoning_ended else "start"
        self.pending = ""  # text held back: it may begin a tag

    def end_reasoning(self) -> None:
        """The prompt turned out to have ended the reasoning: all output is content."""
        if self.state == "start" and not self.pending:
            self.state = "content"

    def feed(self, piece: str, final: bool = False) -> tuple[str, str]:
        """The reasoning and content text that ``piece`` adds (``final``: nothing follows, so
        whatever was held back goes out)."""
        text = self.pending + piece
        self.pending = ""
        reasoning, content = [], []
        while text:
            if self.state == "start":
                stripped = text.lstrip()
                if stripped.startswith(START):
                    text = stripped[len(START):]
                    self.state = "reasoning"
                    continue
                if START.startswith(stripped) and not final:
                    self.pending = text  # maybe the opening tag, not complete yet
                    break
                # No opening tag: the prompt opened it.
                self.state = "reasoning"
                continue
            if self.state == "reasoning":
                head, tag, tail = text.partition(END)
                if tag:
                    reasoning.append(head)
                    text = tail
                    self.state = "content"
                    continue
                keep = 0 if final else tag_prefix_len(text, END)
                reasoning.append(text[: len(text) - keep])
                self.pending = text[len(text) - keep:]
                break
            content.append(text)
            break
        return "".join(reasoning), "".join(content)


def reasoning_span(text: str) -> tuple[int, int]:
    """Where a whole output's reasoning lies, ``text[a:b]`` (the split's rule: after an
    opening tag it starts with, past blanks, up to the first end tag)."""
    stripped = text.lstrip()
    a = len(text) - len(stripped) + len(START) if stripped.startswith(START) else 0
    b = text.find(END, a)
    return a, len(text) if b < 0 else b


class ReasoningCount:
    """One choice's reasoning tokens, kept as its output arrives.

    With ``tag_ids`` (each tag one token), vLLM's count: the tokens after the output's first
    start tag (from its first token where the prompt opened the reasoning) up to its first end
    tag, neither tag counted; none where the prompt closed the reasoning and the output opens
    none. Where the tokenizer splits the tags: the tokens of each piece whose text overlaps
    the reasoning's span (``reasoning_span`` of the text so far); with pieces of one token, the
    tokens whose text holds some of the reasoning (``reasoning_tokens``' rule)."""

    def __init__(self, tag_ids: tuple[int, int] | None) -> None:
        self.tag_ids = tag_ids
        self._n = 0  # tokens seen
        self._start = self._end = -1  # the first start and end tags' positions
        # By text: the output so far, each piece's first and past-last characters, the tokens
        # before each piece (one more entry: all of them), the span's start once the text
        # settles it, and its end once an end tag is found.
        self._text = ""
        self._firsts: list[int] = []
        self._pasts: list[int] = []
        self._before = [0]
        self._a: int | None = None
        self._b: int | None = None

    def feed(self, ids: Sequence[int], text: str = "") -> None:
        """A piece's token ids and text."""
        if self.tag_ids is not None:
            start, end = self.tag_ids
            if self._start < 0 and start in ids:
                self._start = self._n + ids.index(start)
            if self._end < 0 and end in ids:
                self._end = self._n + ids.index(end)
            self._n += len(ids)
            return
        first = len(self._text)
        self._text += text
        self._firsts.append(first)
        # A piece with no text (a character's leading bytes, held back) stands for the
        # character it leads to: [first, first + 1), as reasoning_tokens reads a token.
        self._pasts.append(max(len(self._text), first + 1))
        self._before.append(self._before[-1] + len(ids))
        if self._a is None:
            stripped = self._text.lstrip()
            if stripped.startswith(START) or (stripped and not START.startswith(stripped)):
                self._a = reasoning_span(self._text)[0]
        if self._a is not None and self._b is None:
            found = self._text.find(END, max(self._a, first - len(END) + 1))
            self._b = found if found >= 0 else None

    def count(self, ended: bool) -> int:
        """``ended``: the prompt closed the reasoning."""
        if self.tag_ids is not None:
            if self._start >= 0:
                first = self._start + 1
            elif ended:
                return 0
            else:
                first = 0
            return max(0, (self._end if self._end >= 0 else self._n) - first)
        if ended:
            return 0
        # Not settled yet (blanks, part of an opening tag): as if the output ended here.
        a = self._a if self._a is not None else reasoning_span(self._text)[0]
        b = self._b if self._b is not None else len(self._text)
        if b <= a:
            return 0
        lo = bisect.bisect_right(self._pasts, a)  # the first piece past the span's start
        hi = bisect.bisect_left(self._firsts, b)  # the first piece from its end on
        return max(0, self._before[hi] - self._before[lo])


def reasoning_tokens(ids: Sequence[int], text: str, tag_ids: tuple[int, int] | None,
                     ended: bool, decode: Callable[[Sequence[int]], str]) -> int:
    """A whole output's reasoning tokens (``ReasoningCount``'s). Where the tags span several
    tokens: token ``i`` counts when the characters it completes (``decode(ids[:i + 1])`` past
    ``decode(ids[:i])``; for a character's leading bytes, that character) overlap the
    reasoning's span; found by bisection over the prefixes' decoded lengths."""
    if tag_ids is not None:
        count = ReasoningCount(tag_ids)
        count.feed(ids)
        return count.count(ended)
    if ended or not ids:
        return 0
    a, b = reasoning_span(text)
    if b <= a:
        return 0
    lengths: dict[int, int] = {}

    def length(j: int) -> int:
        # Characters the first j tokens complete: a prefix that ends inside a character
        # decodes it as U+FFFD (one or more), not yet a character of the text (so the lengths
        # grow with j, as the bisection needs).
        if j not in lengths:
            lengths[j] = len(decode(ids[:j]).rstrip("\ufffd"))
        return lengths[j]

    # Token i holds the characters it completes, [length(i), length(i + 1)); one that completes
    # none (a character's leading bytes), the one it leads to, [length(i), length(i) + 1).
    n = len(ids)
    first = bisect.bisect_left(range(n), True,
                               key=lambda i: max(length(i + 1), length(i) + 1) > a)
    past = bisect.bisect_left(range(n), True, key=lambda i: length(i) >= b)
    return max(0, past - first)
