"""The checks of ``SamplingParams``' fields (vLLM's bounds): each failure is a ``ValueError``
naming the parameter, as the server reports it."""

from __future__ import annotations

import math
from typing import Any

from cadence.field_checks import INT64_MAX, INT64_MIN, first_bad_id, is_int, is_real
from cadence.sampling_types import RequestOutputKind

REPETITION_PENALTY_MIN = 1e-30
REPETITION_PENALTY_MAX = 1e30
LOGIT_BIAS_MAX = 1e30
# vLLM's truncation_side: "left" keeps a truncated prompt's last tokens, "right" its first.
TRUNCATION_SIDES = ("left", "right")
MAX_N = 128  # choices per server request (OpenAI's bound; the server's schema holds it)
MAX_N_SEQUENCES = 16384  # choices per SamplingParams (vLLM's VLLM_MAX_N_SEQUENCES default)
MAX_TEMPERATURE = 2.0
MAX_LOGPROB_TOKEN_IDS = 128  # vLLM's bound on logprob_token_ids
# Smallest non-greedy temperature; smaller ones are raised to it (vLLM's ``_MAX_TEMP``).
MIN_TEMPERATURE = 1e-2


def check_sampling_params(p: Any) -> None:
    """Raise ``ValueError`` for the first field of ``p`` (a ``SamplingParams``, not imported
    here: it calls this) out of its bounds."""
    if not is_int(p.n):
        raise ValueError(f"n must be an int, got {p.n!r}.")
    if p.n < 1:
        raise ValueError(f"n must be at least 1, got {p.n}.")
    if p.n > MAX_N_SEQUENCES:
        raise ValueError(f"n must be at most {MAX_N_SEQUENCES}, got {p.n}.")
    if is_real(p.temperature) and not math.isfinite(p.temperature):
        raise ValueError(f"temperature must be a finite number, got {p.temperature!r}.")
    if not is_real(p.temperature) or not p.temperature >= 0.0:
        raise ValueError(f"temperature must be non-negative, got {p.temperature!r}.")
    if p.temperature > MAX_TEMPERATURE:  # OpenAI's and vLLM's bound
        raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], "
                         f"got {p.temperature!r}.")
    if not is_real(p.top_p) or not 0.0 < p.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p.top_p!r}.")
    if not is_int(p.top_k) or p.top_k < -1:
        raise ValueError(
            f"top_k must be 0 (disable), or at least 1, got {p.top_k!r}."
        )
    if p.seed is not None and not (is_int(p.seed) and INT64_MIN <= p.seed <= INT64_MAX):
        raise ValueError(f"seed must be an integer that fits in 64 bits, got {p.seed!r}.")
    if p.max_tokens is not None and (not is_int(p.max_tokens) or p.max_tokens < 1):
        raise ValueError(f"max_tokens must be at least 1, got {p.max_tokens!r}.")
    if not is_int(p.min_tokens) or p.min_tokens < 0:
        raise ValueError(
            f"min_tokens must be greater than or equal to 0, got {p.min_tokens!r}."
        )
    if p.max_tokens is not None and p.min_tokens > p.max_tokens:
        raise ValueError(
            f"min_tokens must be less than or equal to max_tokens={p.max_tokens}, "
            f"got {p.min_tokens}."
        )
    if not isinstance(p.output_kind, RequestOutputKind):
        raise ValueError("output_kind must be a RequestOutputKind, got "
                         f"{p.output_kind!r}.")
    for name in ("detokenize", "skip_special_tokens", "spaces_between_special_tokens",
                 "ignore_eos", "include_stop_str_in_output", "flat_logprobs", "skip_clone"):
        if not isinstance(getattr(p, name), bool):
            raise ValueError(f"{name} must be a bool, got {getattr(p, name)!r}.")
    if not p.detokenize and p.stop:
        raise ValueError("stop strings are only supported when detokenize is True.")
    if p.extra_args is not None and not isinstance(p.extra_args, dict):
        raise ValueError(f"extra_args must be a dict, got {type(p.extra_args).__name__}.")
    if p.stream_interval is not None and (not is_int(p.stream_interval)
                                             or p.stream_interval < 1):
        raise ValueError(f"stream_interval must be at least 1, got {p.stream_interval!r}.")
    if p.skip_reading_prefix_cache is not None and not isinstance(
            p.skip_reading_prefix_cache, bool):
        raise ValueError("skip_reading_prefix_cache must be a boolean or None, got "
                         f"{p.skip_reading_prefix_cache!r}.")
    budget = p.thinking_token_budget
    if budget is not None and (not is_int(budget) or not 0 <= budget <= INT64_MAX):
        raise ValueError("thinking_token_budget must be a non-negative integer or -1 (no "
                         f"limit), got {budget!r}.")
    k = p.truncate_prompt_tokens
    if k is not None and (not is_int(k) or k == 0 or k < -1):
        raise ValueError(f"truncate_prompt_tokens must be an integer >= 1 or -1, got {k!r}.")
    if p.truncation_side not in TRUNCATION_SIDES:
        raise ValueError(f"truncation_side must be 'left' or 'right', got {p.truncation_side!r}.")
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(p, name)
        if value is not None and (not is_int(value) or value < -1):
            raise ValueError(f"{name} must be non-negative or -1 (all), got {value!r}.")
    ids = p.logprob_token_ids
    if ids is not None:
        bad = first_bad_id(ids)
        if bad is not None:
            raise ValueError(f"logprob_token_ids must be token ids, got {bad!r}.")
        if len(ids) > MAX_LOGPROB_TOKEN_IDS:
            raise ValueError(f"logprob_token_ids: at most {MAX_LOGPROB_TOKEN_IDS} ids are "
                             f"allowed, got {len(ids)}.")
        if p.logprobs is not None and p.logprobs != len(ids):
            raise ValueError("logprob_token_ids: with logprobs set too, logprobs must be "
                             f"their count ({len(ids)}), got {p.logprobs}.")
    _check_logits_processors(p)
    if any(not isinstance(s, str) for s in p.stop):
        raise ValueError(f"stop must be a string or a list of strings, got {p.stop!r}.")
    if any(not s for s in p.stop):
        raise ValueError("stop cannot contain an empty string.")
    bad = first_bad_id(p.stop_token_ids)
    if bad is not None:
        raise ValueError(f"stop_token_ids must be non-negative 64-bit integers, got {bad!r}.")


def _check_logits_processors(p: Any) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(p, name)
        if not is_real(value) or not -2.0 <= value <= 2.0:
            raise ValueError(f"{name} must be in [-2, 2], got {value!r}.")
    rp = p.repetition_penalty
    # Applied to float32 logits: past these bounds the penalty (or a logit scaled by it)
    # underflows to 0 or overflows to inf.
    if not is_real(rp) or not REPETITION_PENALTY_MIN <= rp <= REPETITION_PENALTY_MAX:
        raise ValueError(f"repetition_penalty must be in [{REPETITION_PENALTY_MIN:g}, "
                         f"{REPETITION_PENALTY_MAX:g}] (greater than zero), got {rp!r}.")
    if not is_real(p.min_p) or not 0.0 <= p.min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {p.min_p!r}.")
    if p.logit_bias is not None:
        for tok, bias in p.logit_bias.items():
            if not is_int(tok) or not 0 <= tok <= INT64_MAX:
                raise ValueError(f"logit_bias keys must be token ids, got {tok!r}.")
            # float32 logits: a finite bias past the bound becomes inf, and its row NaN; -inf
            # bans the token (vLLM takes it; a row left with no token ends its request).
            if not is_real(bias) or not (-LOGIT_BIAS_MAX <= bias <= LOGIT_BIAS_MAX
                                         or bias == float("-inf")):
                raise ValueError(f"logit_bias values must be in [-{LOGIT_BIAS_MAX:g}, "
                                 f"{LOGIT_BIAS_MAX:g}] or -inf (a ban), got {bias!r}.")
    if p.allowed_token_ids is not None:
        if not p.allowed_token_ids:
            raise ValueError("allowed_token_ids must not be empty.")
        bad = first_bad_id(p.allowed_token_ids)
        if bad is not None:
            raise ValueError(f"allowed_token_ids must be token ids, got {bad!r}.")
    if p.bad_words is not None and any(
        not isinstance(w, str) or not w.strip() for w in p.bad_words
    ):
        raise ValueError(f"bad_words must be non-empty strings, got {p.bad_words!r}.")
