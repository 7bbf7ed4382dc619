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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cadence.config import REASONING_TAGS
from cadence.server.held_text import tag_prefix_len

__all__ = ["REASONING_PARSERS", "ReasoningParser", "ReasoningStream", "reasoning_parser"]

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
