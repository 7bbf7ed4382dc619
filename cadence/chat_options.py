"""A conversation's template options: what ``chat_template_kwargs`` may set, how a request's
kwargs merge over the server's defaults, and the checks of both (vLLM's rules)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

from cadence.json_nesting import MAX_JSON_DEPTH, nesting_depth

# The renderer's options chat_template_kwargs may name: as vLLM merges them, the named option
# wins unless it is unset (None): the kwargs' template, tools and documents count where none is
# given; add_generation_prompt and continue_final_message are always given (booleans), so the
# kwargs' are ignored. The other reserved names (``reserved_template_kwargs``: what the renderer
# passes itself, other named arguments of transformers' renderer) are refused.
TEMPLATE_OVERRIDES = ("chat_template", "add_generation_prompt", "continue_final_message",
                      "tools", "documents")
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "chat_template", "tokenize", "tokenizer", "add_generation_prompt",
    "continue_final_message", "return_dict", "return_tensors", "return_assistant_tokens_mask",
    "padding", "truncation", "max_length", "tools", "documents",
})


@functools.cache
def reserved_template_kwargs() -> frozenset[str]:
    """``RESERVED_TEMPLATE_KWARGS`` and the named arguments of this transformers'
    ``apply_chat_template`` (releases add some, e.g. ``sanitize_control_tokens``; ``self`` too,
    which as a keyword would clash with the bound method): they are the renderer's options, not
    template variables."""
    from transformers import PreTrainedTokenizerBase

    params = inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters
    return RESERVED_TEMPLATE_KWARGS | frozenset(
        name for name, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))


def split_overrides(chat_template_kwargs: Mapping[str, Any] | None
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the renderer's options that ``chat_template_kwargs`` names (``TEMPLATE_OVERRIDES``),
    the template variables left)."""
    kwargs = dict(chat_template_kwargs or {})
    return {k: kwargs.pop(k) for k in TEMPLATE_OVERRIDES if k in kwargs}, kwargs


def named_template(chat_template_kwargs: Mapping[str, Any] | None) -> str | None:
    """The template ``chat_template_kwargs`` names (None for none, or an empty one): it counts
    where no other is given (vLLM's merge)."""
    return split_overrides(chat_template_kwargs)[0].get("chat_template") or None


_OVERRIDE_TYPES = {"chat_template": (str, "a string"), "tools": (list, "a list"),
                   "documents": (list, "a list")}


def template_kwargs_with_defaults(defaults: Mapping[str, Any] | None,
                                  given: dict[str, Any] | None) -> dict[str, Any] | None:
    """A request's ``chat_template_kwargs`` over the server's defaults (vLLM's merge: the
    request's value wins)."""
    if not defaults:
        return given
    return {**defaults, **(given or {})}


def check_template_options(chat_template_kwargs: Mapping[str, Any] | None,
                           add_generation_prompt: bool, continue_final_message: bool
                           ) -> tuple[str, str] | None:
    """(parameter, message) of what is wrong with a conversation's template options, or None.
    The options ``chat_template_kwargs`` may name (``split_overrides``) are checked where they
    can count (a template, tools, documents)."""
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
        return ("chat_template_kwargs", "chat_template_kwargs must be a mapping of template "
                f"variables (or None), got {type(chat_template_kwargs).__name__}.")
    overrides, rest = split_overrides(chat_template_kwargs)
    reserved = sorted(reserved_template_kwargs() & set(rest))
    if reserved:
        return "chat_template_kwargs", f"chat_template_kwargs cannot set {', '.join(reserved)}."
    for key, (kind, said) in _OVERRIDE_TYPES.items():
        value = overrides.get(key)
        if value is None:
            continue
        if not isinstance(value, kind):
            got = type(value).__name__
        elif kind is list and (odd := [v for v in value if not isinstance(v, Mapping)]):
            got = f"an item of type {type(odd[0]).__name__}"
        else:
            continue
        what = f"{said} of objects" if kind is list else said
        return ("chat_template_kwargs",
                f"chat_template_kwargs.{key} must be {what} (or null), got {got}.")
    if nesting_depth(chat_template_kwargs or {}) > MAX_JSON_DEPTH:
        # The template's renderer walks the values recursively: bounded before it does.
        return ("chat_template_kwargs",
                f"chat_template_kwargs: nests deeper than {MAX_JSON_DEPTH} levels.")
    if continue_final_message and add_generation_prompt:
        return ("continue_final_message",
                "continue_final_message and add_generation_prompt cannot both be true.")
    return None
