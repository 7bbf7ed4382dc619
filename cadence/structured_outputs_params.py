"""Structured outputs' parameters of one request (vLLM's ``StructuredOutputsParams``): which
grammar constrains the output, and its options. ``SamplingParams.structured_outputs`` holds one;
``cadence.worker.grammar`` applies it."""

from __future__ import annotations

from dataclasses import dataclass

from cadence.json_nesting import MAX_JSON_DEPTH, nesting_depth

__all__ = ["KINDS", "StructuredOutputsParams"]

# The fields that name a grammar: a spec sets exactly one.
KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """Output constrained to a grammar (vLLM's ``StructuredOutputsParams``): exactly one of a
    JSON schema, any JSON object, a regular expression, a choice of strings, an EBNF grammar
    (xgrammar's dialect), or a structural tag (xgrammar's, as vLLM takes it: JSON text or a dict
    of ``{"type": "structural_tag", "format": {...}}``, or the older ``structures`` (each a
    ``begin`` text, a JSON ``schema`` and an ``end`` text) with the ``triggers`` that start
    them: free text until a trigger, then its tag's JSON)."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # (start, end) token ids of the model's reasoning tags: the grammar applies only once the
    # reasoning has ended (the later of the two tags in the prompt and output is the end tag),
    # as vLLM's structured outputs do under a reasoning parser; the server sets it for its
    # --reasoning-parser. None: the grammar applies from the first output token.
    reasoning_tags: tuple[int, int] | None = None
    # vLLM's options: JSON without optional whitespace (compact); the others concern its other
    # grammar backends (its xgrammar backend ignores them too) and change nothing here.
    disable_any_whitespace: bool = False
    disable_fallback: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | dict | None = None

    def __post_init__(self) -> None:
        for name in ("disable_any_whitespace", "disable_fallback",
                     "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"structured_outputs: {name} must be a bool, got "
                                 f"{getattr(self, name)!r}.")
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            raise ValueError("structured_outputs: whitespace_pattern must be a string.")
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured_outputs must set exactly one of json, regex, choice, "
                             f"grammar, json_object and structural_tag, got {given or 'none'}.")
        if self.structural_tag is not None:
            if not isinstance(self.structural_tag, (str, dict)):
                raise ValueError("structured_outputs: structural_tag must be JSON text or a "
                                 f"dict, got {type(self.structural_tag).__name__}.")
            if nesting_depth(self.structural_tag) > MAX_JSON_DEPTH:
                raise ValueError("structured_outputs: the structural tag nests deeper than "
                                 f"{MAX_JSON_DEPTH} levels.")
        if self.choice is not None and (
                not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError("structured_outputs: choice must be non-empty strings.")
        if self.reasoning_tags is not None:
            tags = tuple(self.reasoning_tags) if isinstance(self.reasoning_tags, (list, tuple)) \
                else ()
            if len(tags) != 2 or not all(isinstance(t, int) and not isinstance(t, bool)
                                         and t >= 0 for t in tags) or tags[0] == tags[1]:
                raise ValueError("structured_outputs: reasoning_tags must be two distinct token "
                                 f"ids (start, end), got {self.reasoning_tags!r}.")
            self.reasoning_tags = tags
        if self.json is not None and nesting_depth(self.json) > MAX_JSON_DEPTH:
            raise ValueError(f"structured_outputs: the JSON schema nests deeper than "
                             f"{MAX_JSON_DEPTH} levels.")
