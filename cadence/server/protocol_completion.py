"""The OpenAI-compatible completions request: one or many prompts (text or token ids), echo,
and vLLM's extensions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from cadence.sampling_params import SamplingParams
from cadence.server.protocol import NO_DEFAULTS, ParamError, SamplingRequest

# Prompts one completions request may carry (each becomes an engine request).
MAX_PROMPTS_PER_REQUEST = 1024


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    # 0 only with echo: the prompt alone comes back (with its logprobs), as OpenAI's API does.
    max_tokens: int | None = Field(default=16, ge=0)
    # -1: the whole vocabulary (vLLM); at most --max-logprobs (the engine checks).
    logprobs: int | None = Field(default=None, ge=-1)
    return_token_ids: bool = False
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
    # vLLM: text prompts get the tokenizer's special tokens (e.g. BOS); false: the text alone.
    add_special_tokens: bool = True

    def check(self) -> None:
        """Semantic checks beyond the schema; raise ``ParamError`` naming the parameter."""
        self._check_common()
        if self.best_of is not None and self.best_of != 1:
            raise ParamError(
                "best_of", f"best_of: only best_of=1 is supported, got {self.best_of}."
            )
        if self.suffix:
            raise ParamError("suffix", "suffix is not supported.")
        if self.use_beam_search and self.echo and self.logprobs is not None:
            raise ParamError("logprobs", "logprobs with echo (the prompt's logprobs) are not "
                             "supported with use_beam_search.")
        if self.logprob_token_ids and self.logprobs is None:
            raise ParamError("logprob_token_ids",
                             "when using logprob_token_ids, logprobs must be set.")
        if self.logprob_token_ids and self.echo:
            raise ParamError("logprob_token_ids", "logprob_token_ids are not supported with echo.")
        if self.max_tokens == 0 and not self.echo:
            raise ParamError("max_tokens",
                             "max_tokens must be at least 1 (0 is allowed only with echo).")
        if self.echo_only and self.min_tokens:
            raise ParamError("min_tokens", "min_tokens must be 0 when max_tokens is 0.")
        if isinstance(self.prompt, list) and len(self.prompt) == 0:
            raise ParamError("prompt", "prompt must not be empty.")
        if (
            isinstance(self.prompt, list)
            and not isinstance(self.prompt[0], int)
            and len(self.prompt) > MAX_PROMPTS_PER_REQUEST
        ):
            raise ParamError(
                "prompt",
                f"a request may carry at most {MAX_PROMPTS_PER_REQUEST} prompts, "
                f"got {len(self.prompt)}.",
            )
        num_prompts = (len(self.prompt) if isinstance(self.prompt, list)
                       and not isinstance(self.prompt[0], int) else 1)
        if num_prompts > 1 and num_prompts * self.n > (
                MAX_PROMPTS_PER_REQUEST):
            raise ParamError(
                "n", f"a request may ask for at most {MAX_PROMPTS_PER_REQUEST} completions "
                f"(prompts times n), got {num_prompts} x {self.n}.")

    def prompts(self) -> list[str | dict[str, Any]]:
        """The request's prompts, each as ``AsyncLLM.generate`` takes it."""
        p = self.prompt
        if isinstance(p, str):
            prompts: list[str | dict[str, Any]] = [p]
        elif all(isinstance(x, int) for x in p):
            prompts = [{"prompt_token_ids": list(p)}]
        else:
            prompts = [x if isinstance(x, str) else {"prompt_token_ids": list(x)} for x in p]
        extra: dict[str, Any] = {}
        if self.cache_salt is not None:
            extra["cache_salt"] = self.cache_salt
        if not self.add_special_tokens:
            extra["add_special_tokens"] = False  # read with text prompts only
        if not extra:
            return prompts
        return [{**({"prompt": x} if isinstance(x, str) else x), **extra} for x in prompts]

    def to_sampling_params(self, defaults: Mapping[str, Any] = NO_DEFAULTS) -> SamplingParams:
        """``defaults``: the model's default sampling fields (generation config)."""
        # vLLM: a completion without max_tokens, or with null, gets the field's default, 16
        # (null becomes it in SamplingRequest._null_is_the_default). An echo of the prompt
        # alone computes one token, which the response leaves out.
        max_tokens = self.max_tokens
        if self.echo_only:
            max_tokens = 1
        return self._sampling_params(max_tokens, self.logprobs, defaults,
                                     self.engine_prompt_logprobs)

    @property
    def shown_logprobs(self) -> int | None:
        """Entries each token's top_logprobs shows: the ``logprobs`` most likely, or (None)
        every entry in its order: the sampled token, then the logprob_token_ids."""
        return None if self.logprob_token_ids else self.logprobs

    @property
    def echo_only(self) -> bool:
        """``echo`` with ``max_tokens`` 0: each choice is the prompt, nothing generated."""
        return self.echo and self.max_tokens == 0

    @property
    def engine_prompt_logprobs(self) -> int | None:
        """What the engine computes: echo with logprobs needs the prompt's (vLLM)."""
        n = self.prompt_logprobs
        if self.echo and self.logprobs is not None and n != -1:
            n = -1 if self.logprobs == -1 else max(n or 0, self.logprobs)
        return n
