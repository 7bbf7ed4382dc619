"""Sampling parameters of one request (vLLM's names and semantics)."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cadence.field_checks import as_list, is_int, is_real, unique
from cadence.repetition import RepetitionDetectionParams
from cadence.sampling_checks import MIN_TEMPERATURE, check_sampling_params
from cadence.sampling_types import RequestOutputKind, SamplingType
from cadence.structured_outputs_params import StructuredOutputsParams


@dataclass
class SamplingParams:
    """How to sample one request. Invalid values raise ``ValueError`` naming the parameter."""

    # The fields in vLLM's order, so that positional arguments mean what they mean there.
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1, kept as given): no top-k; at or above the vocabulary: none
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None  # -1: the whole vocabulary (where --max-logprobs is -1)
    prompt_logprobs: int | None = None  # likewise, for every prompt token but the first
    # vLLM's tracked tokens: each output position's logprobs are the sampled token's and these
    # ids' (in this order, ranked 1..k by their place), in place of the top-k; at most
    # MAX_LOGPROB_TOKEN_IDS, ``logprobs`` unset or their count.
    logprob_token_ids: list[int] | None = None
    # vLLM's: the logprobs come as a ``FlatLogprobs`` (flat columns that read as the list of
    # dicts), which spares the garbage collector an object per entry.
    flat_logprobs: bool = False
    # False: outputs carry token ids only (no text; stop strings need it), as vLLM.
    detokenize: bool = True
    skip_special_tokens: bool = True
    # False (with skip_special_tokens False): an added token right after another is its bare
    # content, without the space a decoder puts between tokens (vLLM's detokenizer).
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # vLLM's: a streamed request's outputs (CUMULATIVE or DELTA) come every this many new
    # tokens, and with the first and the last; it raises the engine's --stream-interval (1
    # unless set), never lowers it (None: the engine's).
    stream_interval: int | None = None
    # vLLM's: this object is dedicated to one request, so ``clone`` may share its containers
    # (a shallow copy); the engine may then change them.
    skip_clone: bool = False
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    # Free-form arguments for custom logits processors and extensions (vLLM), carried as is.
    extra_args: dict[str, Any] | None = None
    bad_words: list[str] | None = None
    # vLLM's: look no prefix up in the cache for this request (None: when it wants prompt
    # logprobs, which every prompt position must be computed for). Unlike vLLM's, a request
    # with prompt logprobs reads none even with False: its prompt logprobs stay whole.
    skip_reading_prefix_cache: bool | None = None
    # vLLM's: at most this many tokens inside a reasoning block, then its end tag is forced
    # (``cadence.worker.thinking_budget``); -1 or None: no limit. Needs the reasoning tags:
    # ``thinking_tags`` (start, end token ids), which the engine fills from its reasoning
    # parser (``LLM(reasoning_parser=...)``, ``--reasoning-parser``).
    thinking_token_budget: int | None = None
    # vLLM's: end the request (finish reason "repetition") once its output repeats a pattern
    # (``cadence.repetition``); a dict of the fields is taken too.
    repetition_detection: RepetitionDetectionParams | None = None
    # Keep only the prompt's last k tokens (left truncation); -1: the model's context length.
    truncate_prompt_tokens: int | None = None
    # vLLM's request field (and tokenization_kwargs key): "right" keeps the prompt's first k
    # tokens instead of its last.
    truncation_side: str = "left"
    thinking_tags: tuple[int, int] | None = field(default=None, repr=False)
    # Filled in by the engine from the tokenizer / generation config; not user-facing.
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)
    # Token sequences of ``bad_words`` (each word with and without a leading space), filled in by
    # the engine's input processor, which holds the tokenizer.
    bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)

    @staticmethod
    def from_optional(
        n: int | None = 1,
        presence_penalty: float | None = 0.0,
        frequency_penalty: float | None = 0.0,
        repetition_penalty: float | None = 1.0,
        temperature: float | None = 1.0,
        top_p: float | None = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        bad_words: list[str] | None = None,
        thinking_token_budget: int | None = None,
        include_stop_str_in_output: bool = False,
        ignore_eos: bool = False,
        max_tokens: int | None = 16,
        min_tokens: int = 0,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        *,
        logit_bias: Mapping[Any, float] | None = None,
        **kwargs: Any,
    ) -> SamplingParams:
        """vLLM's constructor for request fields that may come as null: None takes the default
        of ``n``, the three penalties, ``temperature`` and ``top_p``; ``logit_bias`` keys may be
        token ids as text ("42"), and its biases are clipped to [-100, 100] (OpenAI's range).
        Its first parameters are vLLM's, in vLLM's order; every other field is passed as is,
        by name."""
        if logit_bias is not None:
            if not isinstance(logit_bias, Mapping):
                raise ValueError("logit_bias must be a mapping of token ids to biases, got "
                                 f"{type(logit_bias).__name__}.")
            converted: dict[int, float] = {}
            for token, bias in logit_bias.items():
                try:
                    token_id = int(token)
                except (TypeError, ValueError):
                    raise ValueError("logit_bias keys must be token ids (or their text), got "
                                     f"{token!r}.") from None
                if not is_real(bias):
                    raise ValueError(f"logit_bias values must be numbers, got {bias!r}.")
                converted[token_id] = min(100.0, max(-100.0, bias))
            logit_bias = converted
        return SamplingParams(
            n=1 if n is None else n,
            presence_penalty=0.0 if presence_penalty is None else presence_penalty,
            frequency_penalty=0.0 if frequency_penalty is None else frequency_penalty,
            repetition_penalty=1.0 if repetition_penalty is None else repetition_penalty,
            temperature=1.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            top_k=top_k, min_p=min_p, seed=seed, stop=stop, stop_token_ids=stop_token_ids,
            bad_words=bad_words, thinking_token_budget=thinking_token_budget,
            include_stop_str_in_output=include_stop_str_in_output, ignore_eos=ignore_eos,
            max_tokens=max_tokens, min_tokens=min_tokens, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, logit_bias=logit_bias, **kwargs,
        )

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = as_list("stop", self.stop, what="a string or a list of strings")
        self.stop_token_ids = as_list("stop_token_ids", self.stop_token_ids or [])
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, Mapping):
                raise ValueError("logit_bias must be a mapping of token ids to biases, got "
                                 f"{type(self.logit_bias).__name__}.")
            self.logit_bias = dict(self.logit_bias)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = as_list("allowed_token_ids", self.allowed_token_ids)
        if self.logprob_token_ids is not None:  # vLLM: an empty list asks for nothing
            self.logprob_token_ids = as_list("logprob_token_ids", self.logprob_token_ids) or None
        self.bad_words = as_list("bad_words", self.bad_words or [], strings_ok=True)
        if isinstance(self.structured_outputs, dict):
            try:
                self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
            except TypeError as exc:  # an unknown key
                raise ValueError(f"structured_outputs: {exc}.") from None
        elif self.structured_outputs is not None and not isinstance(
                self.structured_outputs, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams or a dict of "
                             f"its fields, got {type(self.structured_outputs).__name__}.")
        if isinstance(self.repetition_detection, Mapping):
            try:
                self.repetition_detection = RepetitionDetectionParams(
                    **self.repetition_detection)
            except TypeError as exc:  # an unknown key
                raise ValueError(f"repetition_detection: {exc}.") from None
        elif isinstance(self.repetition_detection, RepetitionDetectionParams):
            self.repetition_detection.__post_init__()  # fields set after construction too
        elif self.repetition_detection is not None:
            raise ValueError("repetition_detection must be a RepetitionDetectionParams or a dict "
                             f"of its fields, got {type(self.repetition_detection).__name__}.")
        if is_int(self.thinking_token_budget) and self.thinking_token_budget == -1:
            self.thinking_token_budget = None  # vLLM: -1 is no limit
        if self.thinking_tags is not None:
            tags = tuple(self.thinking_tags)
            if len(tags) != 2 or not all(is_int(t) and t >= 0 for t in tags) or (
                    tags[0] == tags[1]):
                raise ValueError("thinking_tags must be two distinct token ids (start, end), got "
                                 f"{self.thinking_tags!r}.")
            self.thinking_tags = (int(tags[0]), int(tags[1]))
        if is_int(self.seed) and self.seed == -1:
            self.seed = None  # vLLM: -1 asks for no fixed seed
        for name in ("logprobs", "prompt_logprobs"):
            flag = getattr(self, name)
            if flag is True or flag is False:  # vLLM: True is 1; False, not None, acts as 0
                setattr(self, name, int(flag))
        check_sampling_params(self)
        # vLLM: repeated stop ids and bad words count once (first occurrences, in order);
        # after the checks, so that every given item was checked.
        self.stop_token_ids = unique(self.stop_token_ids)
        self.bad_words = unique(self.bad_words)
        # numpy's integers pass the checks as numbers.Integral but overflow where the engine
        # mixes a seed into 64-bit arithmetic: every integer field becomes a Python int.
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if value is not None and type(value) is not int:
                setattr(self, name, int(value))
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            # Dividing logits by a tiny temperature overflows float32: any positive temperature
            # below it samples at MIN_TEMPERATURE (vLLM's clamp; only 0 is greedy).
            self.temperature = MIN_TEMPERATURE
        if self.temperature < _SAMPLING_EPS:
            if self.n > 1:  # vLLM: n identical greedy answers are refused
                raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}.")
            # Greedy: other knobs are meaningless; normalise them (vLLM does the same).
            self.temperature = 0.0
            self.top_p = 1.0
            self.top_k = 0
            self.min_p = 0.0
        self.all_stop_token_ids = set(self.all_stop_token_ids) | set(self.stop_token_ids)
        if self.skip_reading_prefix_cache is None:
            self.skip_reading_prefix_cache = self.prompt_logprobs is not None

    @property
    def num_logprobs(self) -> int | None:
        """Logprobs per output token besides the sampled token's (None: no logprobs): the
        top ``logprobs``, else the tracked ``logprob_token_ids`` (vLLM's)."""
        if self.logprobs is not None:
            return self.logprobs
        return None if self.logprob_token_ids is None else len(self.logprob_token_ids)

    @property
    def has_penalties(self) -> bool:
        """Whether the sampler must count this request's tokens (presence, frequency or
        repetition penalty)."""
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    @property
    def needs_logits_processing(self) -> bool:
        """Whether any per-request logits processor beyond min_tokens applies."""
        return (self.has_penalties or self.min_p > 0.0 or bool(self.logit_bias)
                or self.allowed_token_ids is not None or bool(self.bad_words_token_ids)
                or self.thinking_token_budget is not None)

    @property
    def reads_prefix_cache(self) -> bool:
        """Whether the request may find its prompt's blocks in the prefix cache: not where it
        asks to skip the lookup, nor where it wants prompt logprobs (every prompt position is
        computed then, whatever ``skip_reading_prefix_cache`` says)."""
        return not (self.skip_reading_prefix_cache or self.prompt_logprobs is not None)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def sampling_type(self) -> SamplingType:
        if self.greedy:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    def clone(self) -> SamplingParams:
        """An independent copy: its containers are new objects (``copy.deepcopy``'s result,
        at a fraction of its cost on the engine's per-request path); with ``skip_clone``, a
        shallow copy (vLLM's)."""
        out = copy.copy(self)
        if self.skip_clone:
            return out
        for name in _FLAT_CONTAINERS:  # containers of immutable items (once validated)
            value = getattr(self, name)
            if isinstance(value, (list, dict, set)):
                setattr(out, name, copy.copy(value))
        for name in _NESTED:
            value = getattr(self, name)
            if value is not None:
                setattr(out, name, copy.deepcopy(value))
        return out

    def verified(self) -> SamplingParams:
        """A copy checked and normalised again, as at construction: a field set afterwards
        gets the same ValueError (the engine takes requests' parameters through this)."""
        out = self.clone()
        out.__post_init__()
        return out


# SamplingParams.clone: the fields that hold containers.
_FLAT_CONTAINERS = ("stop", "stop_token_ids", "logit_bias", "allowed_token_ids", "bad_words",
                    "all_stop_token_ids", "logprob_token_ids")
_NESTED = ("structured_outputs", "extra_args", "bad_words_token_ids", "repetition_detection")
_INT_FIELDS = ("n", "top_k", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs",
               "truncate_prompt_tokens", "stream_interval", "thinking_token_budget")
_SAMPLING_EPS = 1e-5


@dataclass(frozen=True)
class BeamSearchParams:
    """vLLM's beam search parameters. ``temperature`` 0 ranks each beam's candidates by their
    logprobs alone; above 0 the sampled token joins them when it is not among the
    ``2 * beam_width`` most likely (the logprobs stay the model's raw ones, as vLLM's)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be an integer of at least 1, got {value!r}.")
            object.__setattr__(self, name, int(value))
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}.")
        for name in ("temperature", "length_penalty"):
            value = getattr(self, name)
            if not is_real(value) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}.")
            object.__setattr__(self, name, float(value))
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")

    @property
    def num_candidates(self) -> int:
        """Logprobs asked of each beam a step."""
        return 2 * self.beam_width

    def step_params(self) -> SamplingParams:
        """One step of one beam: one token, its candidates as logprobs, no text."""
        return SamplingParams(max_tokens=1, temperature=self.temperature,
                              logprobs=self.num_candidates, detokenize=False,
                              ignore_eos=True)
