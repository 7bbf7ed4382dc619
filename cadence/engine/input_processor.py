"""Turns a user prompt and sampling parameters into a validated ``EngineCoreRequest``.

Everything that can be wrong with a request is found here, before it reaches the scheduler:
each problem raises ``InputValidationError`` (a ``ValueError``) naming the parameter.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Mapping, Sequence
from typing import Any

from cadence.core_types import EngineCoreRequest
from cadence.engine.param_checks import (
    MAX_BAD_WORDS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    InputValidationError,
    Tokenizer,
    bad_word_sequences,
    check_params,
    check_some_token_allowed,
    encode_plain,
)
from cadence.engine.truncation import truncate_token_ids, truncation_window
from cadence.field_checks import INT64_MAX, INT64_MIN
from cadence.sampling_params import SamplingParams

__all__ = [
    "MAX_STOP_STRINGS",
    "MAX_STOP_STRING_CHARS",
    "MAX_BAD_WORDS",
    "MAX_STOP_TOKEN_IDS",
    "InputProcessor",
    "InputValidationError",
    "PromptType",
    "bad_word_sequences",
]

PromptType = str | Mapping[str, Any]


class InputProcessor:
    def __init__(
        self,
        tokenizer: Tokenizer | None,
        vocab_size: int,
        max_model_len: int,
        eos_token_ids: list[int],
        num_kv_blocks: int | None = None,
        block_size: int = 16,
        max_logprobs: int = 20,
        max_chars_per_token: int | None = None,
        reasoning_tags: tuple[int, int] | None = None,
    ) -> None:
        """``max_chars_per_token``: no token stands for more characters of a text than this
        (``cadence.engine.prompt_bound``); longer texts than the context allows are then refused
        before tokenizing. None: every text is tokenized and measured. ``reasoning_tags``: the
        reasoning parser's (start, end) token ids, which a thinking budget counts between."""
        if vocab_size < 1 or max_model_len < 1 or block_size < 1:
            raise ValueError("vocab_size, max_model_len and block_size must be positive.")
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        # vLLM's end ids: the tokenizer's eos_token_id is the primary one (a finish with no
        # stop_reason); the generation config's other end ids are stop_token_ids. Without a
        # tokenizer (or one without an end token) the generation config's first id is primary.
        self.eos_token_ids = list(eos_token_ids)
        primary = getattr(tokenizer, "eos_token_id", None)
        if not isinstance(primary, int) or not 0 <= primary < vocab_size:
            primary = self.eos_token_ids[0] if self.eos_token_ids else None
        self.eos_token_id: int | None = primary
        self.extra_eos_token_ids = [t for t in self.eos_token_ids if t != primary]
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.max_logprobs = max_logprobs
        self.max_chars_per_token = max_chars_per_token
        self.reasoning_tags = reasoning_tags

    def process(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
        *,
        strict_max_tokens: bool = False,
    ) -> tuple[EngineCoreRequest, str | None]:
        """Validate and tokenize. Returns the engine request and the prompt text (None when the
        prompt was given as token ids). The caller's ``params`` is never modified.

        A ``max_tokens`` past the context is capped at it (the request ends with "length" at
        ``max_model_len``, as vLLM's engine ends it), or with ``strict_max_tokens`` refused
        with the OpenAI server's error."""
        if not isinstance(request_id, str) or not request_id:
            raise InputValidationError(
                f"request_id must be a non-empty string, got {request_id!r}.", "request_id"
            )
        if not isinstance(params, SamplingParams):
            raise InputValidationError(
                f"sampling_params must be a SamplingParams, got {type(params).__name__}.",
                "sampling_params",
            )
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InputValidationError(
                f"priority must be an integer, got {priority!r}.", "priority", priority
            )
        if not INT64_MIN <= priority <= INT64_MAX:
            raise InputValidationError(
                f"priority must fit in 64 bits, got {priority}.", "priority", priority
            )
        if isinstance(prompt, (list, tuple)):  # vLLM: a bare list of ids is a token prompt
            prompt = {"prompt_token_ids": prompt}
        params = params.verified()
        check_params(params, self.tokenizer, self.vocab_size, self.max_logprobs)
        # A prompt to truncate may be longer than the context: no bound on its text, and only
        # the end of it that truncation keeps is tokenized (truncation.truncation_window).
        truncating = ((params.truncation_side or "left")
                      if params.truncate_prompt_tokens is not None else None)
        prompt_text, token_ids = self._parse_prompt(prompt, truncating)
        if params.truncate_prompt_tokens is not None:  # the prompt text stays as given
            token_ids = truncate_token_ids(token_ids, params.truncate_prompt_tokens,
                                           self.max_model_len, params.max_tokens,
                                           strict_max_tokens, params.truncation_side)
        cache_salt = self._cache_salt(prompt)
        self._validate_token_ids(token_ids)
        params.max_tokens = self._resolve_max_tokens(len(token_ids), params.max_tokens,
                                                     strict_max_tokens)
        if params.min_tokens > params.max_tokens and not strict_max_tokens:
            # Offline, max_tokens past the context was capped (vLLM's engine ends such a request
            # with "length"); min_tokens, no more than the asked max_tokens, is capped with it.
            params.min_tokens = params.max_tokens
        if params.min_tokens > params.max_tokens:
            raise InputValidationError(
                f"min_tokens must be at most max_tokens ({params.max_tokens} for this prompt), "
                f"got {params.min_tokens}.",
                "min_tokens",
                params.min_tokens,
            )

        # Every end id is held back while min_tokens lasts, ignore_eos or not (as vLLM); the
        # scheduler stops on eos_token_id and stop_token_ids, where the generation config's
        # other end ids (e.g. <|end_of_text|> beside <|eot_id|>) go unless ignore_eos.
        if self.eos_token_id is not None:
            params.all_stop_token_ids.add(self.eos_token_id)
        params.all_stop_token_ids |= set(self.extra_eos_token_ids)
        if not params.ignore_eos:
            extra = [t for t in self.extra_eos_token_ids if t not in params.stop_token_ids]
            params.stop_token_ids = list(params.stop_token_ids) + extra
        params.all_stop_token_ids |= set(params.stop_token_ids or [])
        check_some_token_allowed(params)
        self._check_thinking_budget(params)

        request = EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=token_ids,
            sampling_params=params,
            eos_token_id=self.eos_token_id,
            arrival_time=time.time() if arrival_time is None else arrival_time,
            priority=priority,
            cache_salt=cache_salt,
        )
        return request, prompt_text

    @staticmethod
    def _cache_salt(prompt: PromptType) -> str | None:
        """A dict prompt's ``cache_salt`` (vLLM): a non-empty string, or absent."""
        if not isinstance(prompt, Mapping) or prompt.get("cache_salt") is None:
            return None
        salt = prompt["cache_salt"]
        if not isinstance(salt, str) or not salt:
            raise InputValidationError(
                f"cache_salt must be a non-empty string if given, got {salt!r}.", "cache_salt")
        return salt

    def _check_thinking_budget(self, params: SamplingParams) -> None:
        """A thinking budget takes the engine's reasoning tags unless the request brings its
        own; without any it is refused (vLLM ignores it there)."""
        if params.thinking_token_budget is None:
            return
        so = params.structured_outputs
        if so is not None and so.reasoning_tags is None:
            # The grammar applies from the first token: the output has no reasoning block for
            # a budget to count, and a forced end tag would break the grammar.
            params.thinking_token_budget = None
            return
        if params.thinking_tags is None:
            params.thinking_tags = self.reasoning_tags
        if params.thinking_tags is None:
            raise InputValidationError(
                "thinking_token_budget needs a reasoning parser (LLM(reasoning_parser=...), "
                "cadence serve --reasoning-parser) whose tags the tokenizer holds as single "
                "tokens.", "thinking_token_budget", params.thinking_token_budget)
        bad = [t for t in params.thinking_tags if t >= self.vocab_size]
        if bad:
            raise InputValidationError(
                f"thinking_tags: token id {bad[0]} is out of vocabulary (vocabulary size "
                f"{self.vocab_size}).", "thinking_tags", bad[0])

    # Prompt ------------------------------------------------------------------------------------
    def _parse_prompt(self, prompt: PromptType, truncating: str | None = None
                      ) -> tuple[str | None, list[int]]:
        """The prompt's text and ids; ``truncating``: the side truncation cuts ("left",
        "right"), or None (a text too long for the context is refused before tokenizing)."""
        if isinstance(prompt, str):
            return prompt, self._tokenize(prompt, truncating)
        if not isinstance(prompt, Mapping):
            raise InputValidationError(
                "prompt must be a string, a list of token ids, {'prompt': str} or"
                f" {{'prompt_token_ids': [int, ...]}}, got {type(prompt).__name__}.",
                "prompt",
            )
        if prompt.get("multi_modal_data"):  # vLLM refuses it for a text-only model
            raise InputValidationError(
                "multi_modal_data: this model takes text only (no multimodal inputs).",
                "multi_modal_data")
        if "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            if hasattr(ids, "tolist") and getattr(ids, "ndim", None) == 1:
                ids = ids.tolist()  # a numpy array or torch tensor of ids
            if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
                raise InputValidationError(
                    "prompt_token_ids must be a list of integers.", "prompt_token_ids"
                )
            text = prompt.get("prompt")
            return (text if isinstance(text, str) else None), _int_ids(ids)
        if "prompt" in prompt:
            text = prompt["prompt"]
            if not isinstance(text, str):
                raise InputValidationError("prompt must be a string.", "prompt")
            special = prompt.get("add_special_tokens", True)
            if not isinstance(special, bool):
                raise InputValidationError(
                    f"add_special_tokens must be a bool, got {special!r}.", "add_special_tokens")
            return text, self._tokenize(text, truncating, special)
        raise InputValidationError(
            "A dict prompt needs a 'prompt' or a 'prompt_token_ids' key.", "prompt"
        )

    def _tokenize(self, text: str, truncating: str | None = None, special: bool = True
                  ) -> list[int]:
        """``text``'s ids, with the tokenizer's special tokens (e.g. BOS) unless ``special`` is
        false; first refuse a text too long for the context, or (``truncating``) cut it to the
        window truncation keeps."""
        if self.tokenizer is None:
            raise InputValidationError(
                "Text prompts need a tokenizer, and this engine has none (skip_tokenizer_init, "
                "or a model without tokenizer files: see --tokenizer); pass "
                "{'prompt_token_ids': [...]} instead.",
                "prompt",
            )
        # NOTE: an empty text is tokenized: a tokenizer that adds BOS makes it a prompt (vLLM).
        if truncating is None:
            self.check_prompt_text(text)
        else:
            text = truncation_window(text, truncating, self.max_model_len,
                                     self.max_chars_per_token)
        try:
            if not special:
                return encode_plain(self.tokenizer.encode, text)
            return list(self.tokenizer.encode(text))
        except (TypeError, UnicodeError) as exc:  # e.g. a lone surrogate (no UTF-8 for it)
            raise InputValidationError(f"prompt: the text cannot be tokenized ({exc}).",
                                       "prompt") from None

    def check_prompt_text(self, text: str) -> None:
        """Refuse, without tokenizing it, a text that cannot fit in the context."""
        k = self.max_chars_per_token
        if k is None or len(text) <= k * (self.max_model_len - 1):
            return
        at_least = -(-len(text) // k)
        raise InputValidationError(
            f"This model's maximum context length is {self.max_model_len} tokens. However, "
            f"your request has at least {at_least} input tokens ({len(text)} characters). "
            "Please reduce the length of the input messages.",
            "prompt",
            len(text),
        )

    def _validate_token_ids(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise InputValidationError("The decoder prompt cannot be empty.", "prompt")
        if min(token_ids) < 0 or max(token_ids) >= self.vocab_size:
            bad = next(t for t in token_ids if t < 0 or t >= self.vocab_size)
            raise InputValidationError(
                f"prompt_token_ids: token id {bad} is out of vocabulary "
                f"(vocabulary size {self.vocab_size}).",
                "prompt_token_ids",
                bad,
            )

    # Sampling parameters -------------------------------------------------------------------------
    def _resolve_max_tokens(self, num_prompt: int, max_tokens: int | None, strict: bool) -> int:
        limit = self.max_model_len
        if num_prompt >= limit:
            raise InputValidationError(
                f"This model's maximum context length is {limit} tokens. However, your request "
                f"has {num_prompt} input tokens. Please reduce the length of the input messages.",
                "prompt",
                num_prompt,
            )
        # The KV slots a request needs: its prompt and every completion token but the last
        # (never fed back), so at most ``fit`` + 1 tokens in all.
        fit = self._kv_token_capacity()
        if fit is not None and num_prompt > fit:
            raise InputValidationError(
                f"The prompt has {num_prompt} tokens but the KV cache holds at most {fit} tokens "
                f"per request. Please reduce the length of the prompt.",
                "prompt",
                num_prompt,
            )
        if max_tokens is None:
            # Unset: as many as the context (and the KV cache) allow.
            return min(limit, fit + 1 if fit is not None else limit) - num_prompt
        if not strict:  # the engine's rule: capped at the context (vLLM ends it with "length")
            max_tokens = min(max_tokens, limit - num_prompt)
        if num_prompt + max_tokens > limit:
            raise InputValidationError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{_count(num_prompt + max_tokens)} tokens ({num_prompt} in the messages, "
                f"{_count(max_tokens)} in the completion). Please reduce the length of the "
                "messages or completion.",
                "max_tokens",
                max_tokens,
            )
        if fit is not None and num_prompt + max_tokens - 1 > fit:
            blocks = math.ceil((num_prompt + max_tokens - 1) / self.block_size)
            raise InputValidationError(
                f"The request needs {blocks} KV cache blocks ({num_prompt} prompt + {max_tokens} "
                f"completion tokens, the last never cached) but the KV cache holds at most {fit} "
                f"tokens per request. Please reduce max_tokens to at most {fit + 1 - num_prompt} "
                "or shorten the prompt.",
                "max_tokens",
                max_tokens,
            )
        return max_tokens

    def _kv_token_capacity(self) -> int | None:
        # One block stays reserved (the padding / null block), so a request may use the rest.
        if self.num_kv_blocks is None:
            return None
        return max(self.num_kv_blocks - 1, 0) * self.block_size


def _count(n: int) -> str:
    """A token count for a message: past 18 digits, a bound (an integer of thousands of digits,
    which JSON allows, cannot even be written out by ``str``)."""
    return str(n) if n < 10**18 else "more than 10**18"


def _int_ids(ids: Sequence[Any]) -> list[int]:
    """A prompt's token ids as a new list of Python ints; numpy's integers count, bools and
    anything else do not. By the ids' types, not one by one: a plain list of ints (the common
    case) is copied at C speed."""
    kinds = set(map(type, ids))
    if kinds <= {int}:
        return list(ids)
    if any(issubclass(k, bool) or not issubclass(k, numbers.Integral) for k in kinds):
        raise InputValidationError(
            "prompt_token_ids must be a list of integers.", "prompt_token_ids"
        )
    return [int(t) for t in ids]
