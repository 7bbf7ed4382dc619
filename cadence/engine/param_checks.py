"""What a request may ask for, checked before it reaches the scheduler: the caps on stop strings,
stop ids, bad words and grammars (docs/serving.md), the token fields against the vocabulary,
logprobs against --max-logprobs, structured outputs compiled once; each problem is an
``InputValidationError`` (a ``ValueError``) naming the request field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from cadence.sampling_params import SamplingParams

__all__ = [
    "MAX_BAD_WORDS", "MAX_GRAMMAR_CHARS", "MAX_STOP_STRINGS", "MAX_STOP_STRING_CHARS",
    "MAX_STOP_TOKEN_IDS", "InputValidationError", "Tokenizer", "bad_word_sequences",
    "check_params", "check_some_token_allowed", "encode_plain",
]

# Caps on what one request may ask for (docs/serving.md): every stop string is matched against
# every new piece of text, and every stop id against every new token.
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 512
MAX_STOP_TOKEN_IDS = 256
MAX_BAD_WORDS = 128
MAX_GRAMMAR_CHARS = 65536


class InputValidationError(ValueError):
    """A request the engine cannot serve; ``parameter`` names the offending request field."""

    def __init__(self, message: str, parameter: str, value: object = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


def check_params(params: SamplingParams, tokenizer: Tokenizer | None, vocab_size: int,
                 max_logprobs: int) -> None:
    """Request-independent bounds of ``params`` (``InputValidationError`` naming the field);
    normalises top_k at or above the vocabulary to off, -1 logprobs to the vocabulary size, and
    turns the bad words into token sequences."""
    if params.top_k >= vocab_size:
        params.top_k = 0  # vLLM: a top-k covering the whole vocabulary is no top-k
    stops = params.stop or []
    if len(stops) > MAX_STOP_STRINGS:
        raise InputValidationError(
            f"stop: at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stops)}.",
            "stop",
        )
    longest = max((len(s) for s in stops), default=0)
    if longest > MAX_STOP_STRING_CHARS:
        raise InputValidationError(
            f"stop: a stop string may have at most {MAX_STOP_STRING_CHARS} characters, "
            f"got one of {longest}.",
            "stop",
        )
    if len(params.stop_token_ids or []) > MAX_STOP_TOKEN_IDS:
        raise InputValidationError(
            f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} ids are allowed, "
            f"got {len(params.stop_token_ids or [])}.",
            "stop_token_ids",
        )
    if params.stop and tokenizer is None:
        raise InputValidationError(
            "Stop strings need a tokenizer, and this engine was started with "
            "skip_tokenizer_init=True; use stop_token_ids instead.",
            "stop",
        )
    _check_token_fields(params, tokenizer, vocab_size)
    if params.structured_outputs is not None:
        _check_structured_outputs(params, tokenizer)
    for name, kind in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
        setattr(params, name, _check_logprobs(getattr(params, name), name, kind, vocab_size,
                                             max_logprobs))

def _check_logprobs(n: int | None, name: str, kind: str, vocab_size: int,
                    max_logprobs: int) -> int | None:
    """``n`` logprobs per token within --max-logprobs; -1 (all) becomes the vocabulary
    size, allowed only where the cap is the vocabulary (--max-logprobs -1)."""
    if n is None:
        return None
    if n == -1:
        if max_logprobs < vocab_size:
            raise InputValidationError(
                f"{name}=-1 (all) needs --max-logprobs -1; the maximum allowed is "
                f"{max_logprobs}.", name, n,
            )
        return vocab_size
    if n > max_logprobs:
        raise InputValidationError(
            f"Requested {kind} logprobs of {n}, which is greater than max "
            f"allowed: {max_logprobs}",
            name,
            n,
        )
    return n

def _check_structured_outputs(params: SamplingParams, tokenizer: Tokenizer | None) -> None:
    from cadence.worker.grammar import check_structured_outputs

    spec = params.structured_outputs
    assert spec is not None
    if tokenizer is None:
        raise InputValidationError(
            "structured outputs need a tokenizer, and this engine has none.",
            "structured_outputs")
    text = str(spec.json or "") + (spec.regex or "") + (spec.grammar or "") + "".join(
        spec.choice or []) + str(spec.structural_tag or "")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise InputValidationError(
            f"structured_outputs: at most {MAX_GRAMMAR_CHARS} characters of schema, regex, "
            f"choices, grammar or structural tag, got {len(text)}.", "structured_outputs")
    try:
        check_structured_outputs(spec)
    except ValueError as exc:
        raise InputValidationError(str(exc), "structured_outputs") from None

def _check_token_fields(params: SamplingParams, tokenizer: Tokenizer | None,
                        vocab_size: int) -> None:
    """logit_bias, logprob_token_ids, stop_token_ids, allowed_token_ids and bad_words against
    the vocabulary; the bad words become token sequences here."""
    v = vocab_size
    bad = next((t for t in params.logit_bias or {} if t >= v), None)
    if bad is not None:
        raise InputValidationError(
            f"logit_bias: token id {bad} is out of vocabulary (vocabulary size {v}).",
            "logit_bias", bad,
        )
    bad = next((t for t in params.logprob_token_ids or () if t >= v), None)
    if bad is not None:
        raise InputValidationError(
            f"logprob_token_ids: token id {bad} is out of vocabulary (vocabulary size {v}).",
            "logprob_token_ids", bad,
        )
    bad = next((t for t in params.stop_token_ids or () if t >= v), None)
    if bad is not None:  # vLLM refuses them too (they would index the logits)
        raise InputValidationError(
            f"stop_token_ids: token id {bad} is out of vocabulary (vocabulary size {v}).",
            "stop_token_ids", bad,
        )
    allowed = params.allowed_token_ids
    if allowed is not None:
        if len(set(allowed)) > v:
            raise InputValidationError(
                f"allowed_token_ids: at most {v} distinct ids (the vocabulary size), "
                f"got {len(set(allowed))}.", "allowed_token_ids",
            )
        bad = next((t for t in allowed if t >= v), None)
        if bad is not None:
            raise InputValidationError(
                f"allowed_token_ids: token id {bad} is out of vocabulary "
                f"(vocabulary size {v}).", "allowed_token_ids", bad,
            )
    words = params.bad_words or []
    if not words:
        return
    if len(words) > MAX_BAD_WORDS:
        raise InputValidationError(
            f"bad_words: at most {MAX_BAD_WORDS} words are allowed, got {len(words)}.",
            "bad_words",
        )
    if max(len(w) for w in words) > MAX_STOP_STRING_CHARS:
        raise InputValidationError(
            f"bad_words: a word may have at most {MAX_STOP_STRING_CHARS} characters.",
            "bad_words",
        )
    if tokenizer is None:
        raise InputValidationError(
            "bad_words need a tokenizer, and this engine has none; use logit_bias or "
            "allowed_token_ids instead.", "bad_words",
        )
    # Ids past the model's vocabulary (tokens added to the tokenizer) cannot be sampled:
    # a word spelled with one is never generated, and banning it would index past the logits.
    params.bad_words_token_ids = [seq for seq in bad_word_sequences(tokenizer, words)
                                  if all(0 <= t < v for t in seq)]

def check_some_token_allowed(params: SamplingParams) -> None:
    """allowed_token_ids that bad_words (one-token words) and, while min_tokens lasts, the
    stop ids exclude entirely would leave the sampler no token: a 400 here."""
    if params.allowed_token_ids is None:
        return
    left = set(params.allowed_token_ids)
    left -= {seq[0] for seq in params.bad_words_token_ids if len(seq) == 1}
    why = "bad_words"
    if params.min_tokens > 0 and params.structured_outputs is None:
        left -= params.all_stop_token_ids
        why = "bad_words or (while min_tokens lasts) the stop and end-of-sequence ids"
    if not left:
        raise InputValidationError(
            f"allowed_token_ids: every allowed token is excluded by {why}; no token could "
            "be sampled.", "allowed_token_ids",
        )


def bad_word_sequences(tokenizer: Tokenizer, words: Sequence[str]) -> list[list[int]]:
    """Token sequences to ban for ``words``: each word as it starts a text and after a space
    (vLLM's rule: the spaced form counts when its tokens differ from the bare form's in the first
    token only, so that a merge with the space is not mistaken for a different word)."""
    encode = tokenizer.encode
    seqs: list[list[int]] = []
    for word in words:
        bare = encode_plain(encode, word.lstrip())
        if bare:
            seqs.append(bare)
        spaced = encode_plain(encode, " " + word.lstrip())
        if spaced and (not bare or (spaced[0] != bare[0] and len(spaced) == len(bare))):
            seqs.append(spaced)
    return seqs


def encode_plain(encode: Any, text: str) -> list[int]:
    """``text``'s ids without the tokenizer's special tokens (e.g. BOS)."""
    try:
        return list(encode(text, add_special_tokens=False))
    except TypeError:  # a tokenizer without special tokens to add
        return list(encode(text))
