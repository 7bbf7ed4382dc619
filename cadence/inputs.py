"""The prompt shapes ``LLM.generate`` and ``AsyncLLM.generate`` take, as typed dicts (vLLM's
names): a text with optional keys, or token ids. A plain string or a list of ids works too.
vLLM's ``lora_request`` argument is refused here for both (no adapters are served)."""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["TextPrompt", "TokensPrompt", "check_data_parallel_rank", "given_prompt_text",
           "refuse_lora"]


class TextPrompt(TypedDict, total=False):
    prompt: str  # required
    add_special_tokens: bool  # False: no BOS or other special tokens added by the tokenizer
    cache_salt: str  # prefix-cache hits only among requests with the same salt


class TokensPrompt(TypedDict, total=False):
    prompt_token_ids: list[int]  # required
    prompt: str  # the text the ids came from, echoed in the output's ``prompt``
    cache_salt: str


def given_prompt_text(parsed: str | None, prompt_text: Any) -> str | None:
    """vLLM's ``prompt_text`` argument: the text of a prompt given as token ids (what outputs
    report as their ``prompt``); ``parsed`` is the text the prompt itself carried, if any."""
    if prompt_text is None:
        return parsed
    if not isinstance(prompt_text, str):
        raise ValueError(f"prompt_text must be a string or None, got "
                         f"{type(prompt_text).__name__}.")
    if parsed is not None:
        raise ValueError("prompt_text is only for a prompt given as token ids (this prompt has "
                         "its text).")
    return prompt_text


def check_data_parallel_rank(data_parallel_rank: Any) -> None:
    """vLLM's ``data_parallel_rank``: one engine serves here, rank 0 (or None)."""
    if data_parallel_rank not in (None, 0) or isinstance(data_parallel_rank, bool):
        raise ValueError(f"data_parallel_rank must be 0 or None (one engine), got "
                         f"{data_parallel_rank!r}.")


def refuse_lora(lora_request: Any) -> None:
    """vLLM's ``lora_request`` argument: only None (or a list of None, one per prompt, as
    vLLM takes it), as no adapters are served here."""
    if isinstance(lora_request, (list, tuple)) and all(r is None for r in lora_request):
        return
    if lora_request is not None:
        raise ValueError("lora_request: LoRA adapters are not supported; pass None.")
