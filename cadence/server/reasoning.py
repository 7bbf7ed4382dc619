"""Reasoning output kept apart from the answer (vLLM's ``--reasoning-parser``).

A parser splits a model's text at its ``<think> ... </think>`` tags into ``reasoning`` and
``content``, whole (a finished answer) or as it streams (``ReasoningStream``: text that may be
the start of a tag is held back until the next piece shows what it is).

- ``qwen3``: the model opens its own ``<think>``: an output that starts with it (after blanks) is
  reasoning up to ``</think>``, the rest content; an output that does not is all content
  (thinking was off).
- ``deepseek_r1``: the chat template opens ``<think>`` in the prompt, so the output starts inside
  the reasoning (an opening tag it repeats is dropped): reasoning up to ``</think>``, or all of
  it when the tag never comes (it ran out of tokens thinking).
"""

from __future__ import annotations

from dataclasses import dataclass

from cadence.server.held_text import tag_prefix_len

__all__ = ["REASONING_PARSERS", "ReasoningParser", "ReasoningStream", "reasoning_parser"]

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    starts_inside: bool  # the output begins in the reasoning (the prompt opened the tag)

    @property
    def tags(self) -> tuple[str, str]:
        return START, END

    def split(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a whole output; None where a part is empty, except that an
        output without reasoning keeps its content even when empty ("", as without a parser
        and as the stream's content delta)."""
        reasoning, content = self.stream().feed(text, final=True)
        if not reasoning:
            return None, content
        return reasoning, content or None

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self)


REASONING_PARSERS = {
    "qwen3": ReasoningParser("qwen3", starts_inside=False),
    "deepseek_r1": ReasoningParser("deepseek_r1", starts_inside=True),
}


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

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        # "start": nothing decided yet; "reasoning": inside the tags; "content": after them (or
        # no reasoning at all).
        self.state = "start"
        self.pending = ""  # text held back: it may begin a tag

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
                # No opening tag: the prompt opened it, or the model is not reasoning.
                self.state = "reasoning" if self.parser.starts_inside else "content"
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
