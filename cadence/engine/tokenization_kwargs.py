"""vLLM's ``tokenization_kwargs`` of ``LLM.generate``: how text prompts are tokenized and
truncated (``add_special_tokens``, ``do_lower_case``, ``truncation`` / ``max_length``,
``truncate_prompt_tokens``, ``truncation_side``), applied to each prompt and its sampling
parameters before the input processor reads them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cadence.engine.param_checks import InputValidationError
from cadence.sampling_checks import TRUNCATION_SIDES
from cadence.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenizationKwargs:
    add_special_tokens: bool | None = None  # None: the prompt's own (default: true)
    do_lower_case: bool = False
    # The prompt's last this many tokens (-1: max_length, else as many as leave room for
    # max_tokens), where the sampling parameters set no truncate_prompt_tokens (theirs win).
    truncate: int | None = None
    max_length: int | None = None  # the longest prompt taken (after any truncation)
    truncation_side: str | None = None  # "right": the first tokens kept (None: the params')

    @classmethod
    def parse(cls, kwargs: Mapping[str, Any] | None) -> TokenizationKwargs:
        if kwargs is None:
            return cls()
        if not isinstance(kwargs, Mapping):
            raise InputValidationError("tokenization_kwargs must be a dict, got "
                                       f"{type(kwargs).__name__}.", "tokenization_kwargs")
        names = [k for k in kwargs if not isinstance(k, str)]
        if names:
            raise InputValidationError(f"tokenization_kwargs: keys are names, got {names[0]!r}.",
                                       "tokenization_kwargs")
        rest = dict(kwargs)
        special = _flag(rest.pop("add_special_tokens", None), "add_special_tokens")
        lower = bool(_flag(rest.pop("do_lower_case", None), "do_lower_case"))
        max_length = _length(rest.pop("max_length", None), "max_length", 1)
        truncate = _length(rest.pop("truncate_prompt_tokens", None), "truncate_prompt_tokens", -1)
        if truncate == 0:
            raise InputValidationError("tokenization_kwargs: truncate_prompt_tokens must be -1 "
                                       "or at least 1, got 0.", "tokenization_kwargs")
        side = rest.pop("truncation_side", None)
        if side is not None and side not in TRUNCATION_SIDES:
            raise InputValidationError("tokenization_kwargs: truncation_side must be 'left' or "
                                       f"'right', got {side!r}.", "tokenization_kwargs")
        rest.pop("needs_detokenization", None)  # vLLM's: whether prompt text is kept (always)
        # vLLM's reading: a false value changes nothing; True / "longest_first" truncate to
        # max_length, "do_not_truncate" drops this dict's truncate_prompt_tokens.
        truncation = rest.pop("truncation", None)
        if truncation in (True, "longest_first"):
            truncate = -1
        elif truncation == "do_not_truncate":
            truncate = None
        elif truncation:
            rest["truncation"] = truncation
        if rest:  # vLLM warns and goes on
            logger.warning("tokenization_kwargs not supported, ignored: %s", sorted(rest))
        return cls(special, lower, truncate, max_length, side)

    def prompt(self, prompt: Any) -> Any:
        """``prompt`` with the text options applied (token prompts are left as they are)."""
        if isinstance(prompt, str):
            prompt = {"prompt": prompt}
        elif not (isinstance(prompt, Mapping) and isinstance(prompt.get("prompt"), str)
                  and "prompt_token_ids" not in prompt):
            return prompt
        out = dict(prompt)
        if self.do_lower_case:
            out["prompt"] = out["prompt"].lower()
        if self.add_special_tokens is not None:
            out["add_special_tokens"] = self.add_special_tokens
        return out

    def params(self, params: SamplingParams) -> SamplingParams:
        """``params`` with the truncation to apply: the parameters' own, else this dict's; -1
        is ``max_length`` where one is given. Anything but a ``SamplingParams`` is returned as
        it is, for the input processor to refuse."""
        if not isinstance(params, SamplingParams):
            return params
        k = params.truncate_prompt_tokens
        if k is None:
            k = self.truncate
        if k == -1 and self.max_length is not None:
            k = self.max_length
        side = self.truncation_side or params.truncation_side
        if k == params.truncate_prompt_tokens and side == params.truncation_side:
            return params
        out = params.clone()
        out.truncate_prompt_tokens = k
        out.truncation_side = side
        return out

    def check_length(self, num_tokens: int) -> None:
        if self.max_length is not None and num_tokens > self.max_length:
            raise InputValidationError(
                f"The prompt has {num_tokens} tokens, more than tokenization_kwargs max_length="
                f"{self.max_length}; shorten it or pass truncation=True.", "prompt", num_tokens)


def _flag(value: Any, name: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise InputValidationError(f"tokenization_kwargs: {name} must be true or false, got "
                                   f"{value!r}.", "tokenization_kwargs")
    return value


def _length(value: Any, name: str, least: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InputValidationError(f"tokenization_kwargs: {name} must be an integer of at least "
                                   f"{least}, got {value!r}.", "tokenization_kwargs")
    return value
