"""What a caller gets back for a request (vLLM's ``RequestOutput`` shape)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, MutableSequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar, overload

__all__ = ["CompletionOutput", "FlatLogprobs", "Logprob", "PromptLogprobs", "RequestMetrics",
           "RequestOutput", "SampleLogprobs"]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


def _forward_compatible(cls: type[_T]) -> type[_T]:
    """vLLM's ``RequestOutput`` takes keyword arguments a newer version added and ignores them
    with a warning (vLLM's tests/test_outputs.py): code written for a newer vLLM runs here."""
    init: Callable[..., None] = cls.__init__  # type: ignore[misc]
    names = frozenset(f.name for f in fields(cls))  # type: ignore[arg-type]
    warned: set[str] = set()

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs and not names.issuperset(kwargs):
            unknown = sorted(set(kwargs) - names)
            if not warned.issuperset(unknown):
                warned.update(unknown)
                logger.warning("%s: ignoring arguments it does not know: %s", cls.__name__,
                               ", ".join(unknown))
            kwargs = {k: v for k, v in kwargs.items() if k in names}
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    return cls


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = most likely
    decoded_token: str | None = None


# vLLM's ``FlatLogprobs`` (``SamplingParams.flat_logprobs``): a request's logprobs as a few flat
# columns instead of one dict and one ``Logprob`` per entry. A long answer with top-k logprobs
# otherwise holds a dict per token and k + 1 ``Logprob`` objects, all tracked by the cyclic
# garbage collector. It reads as the list of dicts it replaces: ``len`` is the number of
# positions, ``flat[i]`` builds position ``i``'s dict (``{}`` where the list form holds None: the
# first prompt token), slices are ``FlatLogprobs``, and it only grows.
Position = dict[int, Logprob]


@dataclass
class FlatLogprobs(MutableSequence[Position]):
    """Position ``i``'s entries are ``token_ids[j]``, ``logprobs[j]``, ``ranks[j]`` and
    ``decoded_tokens[j]`` for ``j`` in ``[start_indices[i], end_indices[i])``, in the order its
    dict had them (the sampled or prompt token first)."""

    start_indices: list[int] = field(default_factory=list)
    end_indices: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int | None] = field(default_factory=list)
    decoded_tokens: list[str | None] = field(default_factory=list)

    def append(self, position: Position | None) -> None:
        """Add one position (None: a position without logprobs, read back as ``{}``)."""
        self.start_indices.append(len(self.token_ids))
        for token_id, lp in (position or {}).items():
            self.token_ids.append(token_id)
            self.logprobs.append(lp.logprob)
            self.ranks.append(lp.rank)
            self.decoded_tokens.append(lp.decoded_token)
        self.end_indices.append(len(self.token_ids))

    def __len__(self) -> int:
        return len(self.start_indices)

    @overload
    def __getitem__(self, index: int) -> Position: ...

    @overload
    def __getitem__(self, index: slice) -> FlatLogprobs: ...

    def __getitem__(self, index: int | slice) -> Position | FlatLogprobs:
        if isinstance(index, slice):
            out = FlatLogprobs()
            for i in range(*index.indices(len(self))):
                s, e = self.start_indices[i], self.end_indices[i]
                out.start_indices.append(len(out.token_ids))
                out.token_ids += self.token_ids[s:e]
                out.logprobs += self.logprobs[s:e]
                out.ranks += self.ranks[s:e]
                out.decoded_tokens += self.decoded_tokens[s:e]
                out.end_indices.append(len(out.token_ids))
            return out
        i = range(len(self))[index]  # IndexError and negative indices as a list's
        return {self.token_ids[j]: Logprob(self.logprobs[j], self.ranks[j], self.decoded_tokens[j])
                for j in range(self.start_indices[i], self.end_indices[i])}

    def __iter__(self) -> Iterator[Position]:
        for i in range(len(self)):
            yield self[i]

    def __setitem__(self, index: object, value: object) -> None:
        raise TypeError("FlatLogprobs only grows: positions cannot be replaced.")

    def __delitem__(self, index: object) -> None:
        raise TypeError("FlatLogprobs only grows: positions cannot be deleted.")

    def insert(self, index: int, value: Position | None) -> None:
        raise TypeError("FlatLogprobs only grows: use append.")


# One dict per generated token: the sampled token and the top-N, each by token id.
SampleLogprobs = list[dict[int, Logprob]] | FlatLogprobs
# None for the first prompt token, then one dict per prompt token: the token itself and the top-N.
PromptLogprobs = list[dict[int, Logprob] | None] | FlatLogprobs


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    # vLLM's field (in its place: positional arguments mean what they mean there); no MoE
    # routing is recorded here.
    routed_experts: None = field(default=None, repr=False)
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | "repetition"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    lora_request: None = field(default=None, repr=False)  # vLLM's field; adapters: none here
    kv_transfer_params: None = field(default=None, repr=False)  # vLLM's; no KV transfer here

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    """Timestamps of one request, all from ``time.monotonic()``."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_generation_tokens: int = 0
    queued_time: float | None = None  # when the engine core's scheduler got it

    def copy(self) -> RequestMetrics:
        return RequestMetrics(
            self.arrival_time,
            self.first_scheduled_time,
            self.first_token_time,
            self.last_token_time,
            self.finished_time,
            self.num_generation_tokens,
            self.queued_time,
        )

    # vLLM v1's names (RequestStateStats: engine timestamps, 0.0 until set) and v0's queue
    # time, read from the fields above.
    @property
    def queued_ts(self) -> float:
        return self.queued_time or 0.0

    @property
    def scheduled_ts(self) -> float:
        return self.first_scheduled_time or 0.0

    @property
    def first_token_ts(self) -> float:
        return self.first_token_time or 0.0

    @property
    def last_token_ts(self) -> float:
        return self.last_token_time or 0.0

    @property
    def first_token_latency(self) -> float:
        return self.time_to_first_token or 0.0

    @property
    def time_in_queue(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time

    @property
    def mean_time_per_output_token(self) -> float | None:
        if self.first_token_time is None or self.last_token_time is None:
            return None
        if self.num_generation_tokens < 2:
            return None
        decode = self.last_token_time - self.first_token_time
        return decode / (self.num_generation_tokens - 1)


@_forward_compatible
@dataclass
class RequestOutput:
    # vLLM's order, so that positional construction means the same here.
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: PromptLogprobs | None = field(repr=False)
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    # vLLM's fields for features this engine has not (adapters, encoder-decoder models,
    # multimodal inputs, disaggregated KV transfer): always empty, for code written for vLLM.
    lora_request: None = field(default=None, repr=False)
    encoder_prompt: None = field(default=None, repr=False)
    encoder_prompt_token_ids: None = field(default=None, repr=False)
    num_cached_tokens: int | None = None
    multi_modal_placeholders: dict[str, Any] = field(default_factory=dict, repr=False)
    kv_transfer_params: None = field(default=None, repr=False)

    def add(self, next_output: RequestOutput, aggregate: bool) -> None:
        """Merge a later output of the same request into this one.

        ``aggregate`` (DELTA outputs): text is appended, token ids and logprobs extended, and
        the latest cumulative logprob, finish reason and stop reason win. Otherwise the later
        completion replaces the earlier one.
        """
        self.finished |= next_output.finished
        if self.prompt_logprobs is None:
            self.prompt_logprobs = next_output.prompt_logprobs
        self.num_cached_tokens = next_output.num_cached_tokens
        self.metrics = next_output.metrics
        for nxt in next_output.outputs:
            for i, cur in enumerate(self.outputs):
                if cur.index != nxt.index:
                    continue
                if aggregate:
                    cur.text += nxt.text
                    cur.token_ids = [*cur.token_ids, *nxt.token_ids]
                    if nxt.logprobs:
                        merged = nxt.logprobs[:0] if cur.logprobs is None else cur.logprobs[:]
                        merged.extend(nxt.logprobs)  # a list or a FlatLogprobs, as it came
                        cur.logprobs = merged
                    cur.cumulative_logprob = nxt.cumulative_logprob
                    cur.finish_reason = nxt.finish_reason
                    cur.stop_reason = nxt.stop_reason
                else:
                    self.outputs[i] = nxt
                break
            else:
                self.outputs.append(nxt)
