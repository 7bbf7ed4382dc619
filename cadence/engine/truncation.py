"""Prompt truncation (vLLM's ``truncate_prompt_tokens`` and ``truncation_side``): how many
tokens a request keeps, which ones, and the end of a long text they come from, so that a text
far past the context is not tokenized whole."""

from __future__ import annotations

from collections.abc import Sequence

from cadence.engine.param_checks import InputValidationError

__all__ = ["TRUNCATION_MARGIN_TOKENS", "kept_tokens", "max_input_tokens", "truncate_token_ids",
           "truncation_length", "truncation_window"]


def max_input_tokens(max_model_len: int, max_tokens: int | None) -> int:
    """The longest prompt that leaves room for ``max_tokens`` (unset: for one token)."""
    return max_model_len - (1 if max_tokens is None else max_tokens)


# Tokens between the cut of a long text to truncate and the tokens kept from it: the cut may
# change how the text right after it tokenizes (a word split in two), never that far away.
TRUNCATION_MARGIN_TOKENS = 1024


def truncation_length(k: int, max_model_len: int, max_tokens: int | None) -> int:
    """How many of a prompt's tokens ``truncate_prompt_tokens=k`` keeps: -1 is as many as
    leave room for ``max_tokens`` (vLLM's renderer: max_model_len - max_tokens)."""
    return max_input_tokens(max_model_len, max_tokens) if k == -1 else k


def kept_tokens(token_ids: Sequence[int], keep: int, side: str) -> list[int]:
    """The ``keep`` tokens truncation leaves: the last ones (``side`` "left", vLLM's default)
    or the first ones ("right")."""
    if len(token_ids) <= keep:
        return list(token_ids)
    return list(token_ids[:keep] if side == "right" else token_ids[len(token_ids) - keep:])


def truncate_token_ids(token_ids: list[int], k: int, max_model_len: int, max_tokens: int | None,
                       strict: bool, side: str = "left") -> list[int]:
    """vLLM's truncate_prompt_tokens: the prompt's last ``k`` tokens (its first with
    ``side`` "right"; -1: as many as leave room for ``max_tokens``). With ``strict`` (the
    server's rule) more than that room is an error; offline (vLLM's ``LLM``) only more than
    ``max_model_len`` is, and a longer ``max_tokens`` is capped as for any prompt."""
    room = max_input_tokens(max_model_len, max_tokens)
    if not strict and k != -1:
        if k > max_model_len:
            raise InputValidationError(
                f"truncate_prompt_tokens={k} cannot be greater than max_model_len="
                f"{max_model_len}. Please request a smaller truncation size.",
                "truncate_prompt_tokens", k)
        return kept_tokens(token_ids, k, side)
    if room < 1:
        raise InputValidationError(
            f"max_tokens={max_tokens} leaves no room for a prompt in this model's maximum "
            f"context length of {max_model_len} tokens.", "max_tokens", max_tokens)
    keep = truncation_length(k, max_model_len, max_tokens)
    if keep > room:
        raise InputValidationError(
            f"truncate_prompt_tokens={keep} cannot be greater than max_model_len - "
            f"max_tokens = {room}. Please request a smaller truncation size.",
            "truncate_prompt_tokens", keep)
    return kept_tokens(token_ids, keep, side)


def truncation_window(text: str, side: str, max_model_len: int,
                      max_chars_per_token: int | None) -> str:
    """The end of a text to truncate (its start, ``side`` "right") that the kept tokens
    come from: the characters of a context's worth of tokens plus a margin of
    ``TRUNCATION_MARGIN_TOKENS`` (no token stands for more than ``max_chars_per_token``
    characters, so the kept tokens lie inside, that many tokens clear of the cut: they
    tokenize as in the whole text). The whole text where it is shorter, or where the
    tokenizer gives no bound. Tokenizing a text far past the context whole would hold the
    one input thread, and every request behind it, for seconds."""
    k = max_chars_per_token
    if k is None:
        return text
    window = k * (max_model_len + TRUNCATION_MARGIN_TOKENS)
    if len(text) <= window:
        return text
    return text[-window:] if side == "left" else text[:window]
