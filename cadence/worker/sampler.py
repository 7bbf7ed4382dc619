"""Token sampling from logits: per-request logits processors, greedy, temperature, min_p, top-k /
top-p, per-request seeds, logprobs.

Mirrors vLLM v1's sampler. Every operation works row-wise, so a row's result depends only on its
own logits and (for seeded rows) its own generator, never on the rest of the batch. The device
path has no host synchronisation: tensors in, tensors out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from cadence.runner_output import LogprobsLists
from cadence.sampling_params import SamplingParams
from cadence.worker.grammar_mask import GrammarMask, apply_grammar_mask
from cadence.worker.greedy_argmax import ArgmaxScratch, argmax_rows
from cadence.worker.logits_processors import (
    LogitsInputs,
    apply_logits_processors,
    apply_min_p,
)
from cadence.worker.top_k_top_p import apply_top_k_top_p, exponential_race, sample_from_top_k

_SAMPLING_EPS = 1e-5
_MAX_FAST_TOP_K = 1024  # above this a full sort is as cheap as torch.topk
# With top-p the candidate path runs many small kernels: below this many rows the full sort is
# as fast or faster (H200, 152k vocabulary, scripts/sampler_bench.py in docs/perf.md: 0.49
# against 1.26 ms for one row, 1.55 against 1.52 for 64, 4.81 against 2.61 for 256).
_MIN_FAST_TOP_P_ROWS = 64
_MASK64 = (1 << 64) - 1


@dataclass
class SamplingMetadata:
    """Per-step sampling inputs for the N rows of the logits."""

    temperature: torch.Tensor | None  # [N] float32; None when all rows are greedy
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None  # [N] float32; None when no row uses top-p
    top_k: torch.Tensor | None  # [N] int64; None when no row uses top-k (<= 0: off)
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    max_num_logprobs: int | None = None  # None: no row wants logprobs
    # (rows [R], ids [R, max_num_logprobs]) of the rows whose logprobs are of their
    # ``logprob_token_ids`` (each padded with its last id) instead of the top-k; None: no row's.
    tracked: tuple[torch.Tensor, torch.Tensor] | None = None
    # row -> ids masked to -inf (min_tokens: the stop/eos ids while output count < min_tokens)
    banned_token_ids: dict[int, list[int]] = field(default_factory=dict)
    # Host-side hint: every non-greedy row has a top-k of at most this. Lets the sampler take
    # the top-k candidates instead of sorting the whole vocabulary (same tokens, much faster).
    max_top_k: int | None = None
    # (rows, min_p) of the non-greedy rows with a min_p; None when there are none.
    min_p: tuple[torch.Tensor, torch.Tensor] | None = None
    # Allowed ids, bad words, logit bias, penalties (``logits_processors``); None: no row has any.
    processors: LogitsInputs | None = None
    # Structured outputs: the bitmasks of the rows under a grammar (``grammar_mask``).
    grammar: GrammarMask | None = None

    @classmethod
    def greedy(cls) -> SamplingMetadata:
        """``from_rows``' metadata for rows that are all ``plain_greedy_row``."""
        return cls(temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None)

    @classmethod
    def from_params(
        cls,
        params: Sequence[SamplingParams],
        num_output_tokens: Sequence[int],
        generators: dict[int, torch.Generator] | None = None,
        device: torch.device | str = "cpu",
    ) -> SamplingMetadata:
        """Build the metadata for rows ``params`` whose requests hold ``num_output_tokens``.

        ``generators`` maps a row to its generator (already seeded for this step, see
        ``seed_generator``); rows without one draw from the global generator.
        """
        rows = SamplingRows.of(params)
        return cls.from_rows(params, rows, num_output_tokens, generators, device)

    @classmethod
    def from_rows(
        cls,
        params: Sequence[SamplingParams],
        rows: SamplingRows,
        num_output_tokens: Sequence[int],
        generators: dict[int, torch.Generator] | None = None,
        device: torch.device | str = "cpu",
    ) -> SamplingMetadata:
        """``from_params`` with the numeric parameters already gathered into ``rows``."""
        greedy = rows.temperature < _SAMPLING_EPS
        all_greedy = bool(greedy.all())
        all_random = not bool(greedy.any())
        temperature = None
        if not all_greedy:
            temperature = torch.from_numpy(rows.temperature).to(device)
        top_p = None
        if bool((rows.top_p < 1.0).any()):
            top_p = torch.from_numpy(rows.top_p).to(device)
        top_k = None
        max_top_k = None
        if bool((rows.top_k > 0).any()):
            top_k = torch.from_numpy(rows.top_k).to(device)
            random_ks = rows.top_k[~greedy]
            if random_ks.size and int(random_ks.min()) > 0:
                max_top_k = int(random_ks.max())
        wanted = [p.num_logprobs for p in params if p.num_logprobs is not None]
        banned: dict[int, list[int]] = {}
        for row, (p, n_out) in enumerate(zip(params, num_output_tokens, strict=True)):
            # A grammar decides where structured output ends: min_tokens bans no stop id there
            # (banning the grammar's only allowed token would leave the row nothing to sample).
            if n_out < p.min_tokens and p.all_stop_token_ids and p.structured_outputs is None:
                banned[row] = sorted(p.all_stop_token_ids)
        min_p = None
        min_p_rows = np.nonzero(rows.min_p > 0.0)[0]  # greedy rows have min_p 0
        if min_p_rows.size:
            min_p = (torch.from_numpy(min_p_rows.astype(np.int64)).to(device),
                     torch.from_numpy(rows.min_p[min_p_rows]).to(device))
        most = max(wanted) if wanted else None
        tracked = None
        tracked_rows = [] if most is None else [
            r for r, p in enumerate(params) if p.logprob_token_ids is not None]
        if tracked_rows:
            ids = [params[r].logprob_token_ids for r in tracked_rows]
            tracked = (torch.tensor(tracked_rows, dtype=torch.int64).to(device),
                       torch.tensor([t + t[-1:] * (most - len(t)) for t in ids],  # type: ignore
                                    dtype=torch.int64).to(device))
        return cls(
            temperature=temperature,
            all_greedy=all_greedy,
            all_random=all_random,
            top_p=top_p,
            top_k=top_k,
            generators=dict(generators or {}),
            max_num_logprobs=most,
            tracked=tracked,
            banned_token_ids=banned,
            max_top_k=max_top_k,
            min_p=min_p,
        )


def plain_greedy_row(params: SamplingParams, temperature: float, top_p: float, top_k: int,
                     min_p: float) -> bool:
    """Whether a row (its parameters, and its numeric ones as ``SamplingRows`` holds them)
    adds nothing to the metadata ``from_rows`` builds beyond greedy: no temperature, top-p,
    top-k or min-p, no logprobs, no min_tokens bans, no logits processor, no grammar. A batch
    of such rows samples with ``SamplingMetadata.greedy()``."""
    return (temperature < _SAMPLING_EPS and top_p >= 1.0 and top_k <= 0 and min_p <= 0.0
            and params.num_logprobs is None and not params.needs_logits_processing
            and params.structured_outputs is None
            and not (params.min_tokens > 0 and params.all_stop_token_ids))


@dataclass
class SamplingRows:
    """The numeric sampling parameters of N rows, as the sampler's dtypes."""

    temperature: np.ndarray  # [N] float32
    top_p: np.ndarray  # [N] float32
    top_k: np.ndarray  # [N] int64, <= 0: off
    min_p: np.ndarray  # [N] float32, 0 = off

    @classmethod
    def of(cls, params: Sequence[SamplingParams]) -> SamplingRows:
        return cls(
            temperature=np.array([p.temperature for p in params], dtype=np.float32),
            top_p=np.array([p.top_p for p in params], dtype=np.float32),
            top_k=np.array([p.top_k for p in params], dtype=np.int64),
            min_p=np.array([p.min_p for p in params], dtype=np.float32),
        )


@dataclass
class LogprobsTensors:
    """Device-side logprobs of one step: column 0 is the sampled token, then the top-k."""

    logprob_token_ids: torch.Tensor  # [N, k + 1] int64
    logprobs: torch.Tensor  # [N, k + 1] float32
    sampled_token_ranks: torch.Tensor  # [N] int64, 1 = most likely

    def tolists(self) -> LogprobsLists:
        return LogprobsLists(
            logprob_token_ids=self.logprob_token_ids.tolist(),
            logprobs=self.logprobs.tolist(),
            sampled_token_ranks=self.sampled_token_ranks.tolist(),
        )


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [N] int64 on the logits' device
    logprobs: LogprobsTensors | None
    # [N] bool: rows whose masks left no token (their sampled id is meaningless); None when
    # no row of the step had a mask.
    no_token: torch.Tensor | None = None


def seed_generator(gen: torch.Generator, seed: int, step: int) -> None:
    """Re-seed ``gen`` from (request seed, output index).

    The runner calls this for each seeded row before every step, so a seeded request draws the
    same noise for its k-th output token however it was batched, preempted or overlapped.
    """
    gen.manual_seed(_mix_seed(seed, step))


def _mix_seed(seed: int, step: int) -> int:
    # SplitMix64 finaliser over the pair: distinct (seed, step) pairs give unrelated streams.
    x = ((seed & _MASK64) * 0x9E3779B97F4A7C15 + (step & _MASK64) + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return x & ((1 << 63) - 1)


class Sampler:
    """Samples one token per row of ``logits`` [N, V] (float32 or the model's dtype: every path
    that changes them works on a float32 copy, so both give the same tokens and logprobs).

    ``logprobs_mode`` (vLLM's): the logprobs are of the logits as they come (``raw_``, after
    the grammar's mask), or as sampled (``processed_``: after the logits processors and
    penalties, then for sampled rows temperature, min-p, top-k and top-p, masked tokens at
    -inf); log-probabilities (``_logprobs``) or the logits themselves (``_logits``).
    """

    def __init__(self, logprobs_mode: str = "raw_logprobs") -> None:
        self._argmax_scratch = ArgmaxScratch()
        self.logprobs_mode = logprobs_mode
        self._processed = logprobs_mode.startswith("processed")
        self._as_logits = logprobs_mode.endswith("logits")

    def warm_up(self, vocab_size: int, device: torch.device,
                dtype: torch.dtype = torch.float32) -> None:
        """Compile (or load) the greedy argmax's kernels for this vocabulary at start-up, not
        on the first request's time to first token: for float32 logits and the model's
        ``dtype`` (the runner hands the model's own logits to plain greedy rows)."""
        for logits_dtype in dict.fromkeys((torch.float32, dtype)):
            argmax_rows(torch.zeros(1, vocab_size, device=device, dtype=logits_dtype),
                        self._argmax_scratch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # NOTE: start-up only; later steps use other streams

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        if (md.all_greedy and md.grammar is None and md.processors is None
                and not md.banned_token_ids and md.max_num_logprobs is None):
            # Nothing changes the logits: no float32 copy, the argmax of the caller's.
            return SamplerOutput(argmax_rows(logits, self._argmax_scratch), None)
        # Work on a float32 copy: the caller's logits are never modified.
        logits = logits.to(torch.float32, copy=True)
        if md.grammar is not None:
            # The grammar comes first, as in vLLM (the logprobs see its mask too).
            apply_grammar_mask(logits, md.grammar)
        # Raw modes: the logprobs of the logits as they are here (a new tensor, so that the
        # processors below may work on ``logits`` in place).
        scores = None
        wanted = md.max_num_logprobs is not None
        if wanted and not self._processed:
            scores = logits.clone() if self._as_logits else torch.log_softmax(logits, dim=-1)

        if md.processors is not None or md.banned_token_ids:
            apply_logits_processors(logits, md.processors, md.banned_token_ids)
        no_token = None
        p = md.processors
        if (md.grammar is not None or md.banned_token_ids
                or (p is not None and (p.allowed or p.bias or p.conditional is not None))):
            # Masks that can exclude every token (a grammar against allowed_token_ids, a
            # grammar that cannot finish, a penalty overflowing a huge negative bias); steps
            # with penalties alone, the common case, skip this pass over the logits.
            no_token = logits.amax(dim=-1) == float("-inf")
        processed = wanted and self._processed
        sampled, final = self._sample(logits, md, processed)
        if processed:
            scores = final if self._as_logits else torch.log_softmax(final, dim=-1)

        logprobs = None
        if scores is not None:
            assert md.max_num_logprobs is not None
            logprobs = gather_logprobs(scores, md.max_num_logprobs, sampled, md.tracked)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs, no_token=no_token)

    def _sample(self, logits: torch.Tensor, md: SamplingMetadata, processed: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The sampled ids, and the logits as the last sampling step saw them (with
        ``processed``: every top-k / top-p mask applied to the whole row)."""
        greedy = None
        if not md.all_random:
            greedy = argmax_rows(logits, self._argmax_scratch)
            if md.all_greedy:
                return greedy, logits
        assert md.temperature is not None, "temperature is required unless all rows are greedy"
        temp = md.temperature.to(torch.float32)
        is_greedy = temp < _SAMPLING_EPS
        # Greedy rows take the argmax below; dividing them by 1 keeps their logits finite.
        logits.div_(torch.where(is_greedy, torch.ones_like(temp), temp).unsqueeze(1))
        if md.min_p is not None:
            apply_min_p(logits, *md.min_p)
        kmax = md.max_top_k
        if (md.top_p is not None and logits.shape[0] < _MIN_FAST_TOP_P_ROWS) or processed:
            # Both paths give the same tokens: here the full sort is faster (or the whole
            # masked row is wanted).
            kmax = None
        if md.top_k is not None and kmax is not None and 0 < kmax <= _MAX_FAST_TOP_K:
            random = sample_from_top_k(logits, md.top_k, kmax, md.top_p, md.generators)
        else:
            logits = apply_top_k_top_p(logits, md.top_k, md.top_p)
            random = exponential_race(logits.softmax(dim=-1), md.generators)
        if greedy is None:
            return random, logits
        return torch.where(is_greedy, greedy, random), logits


def gather_logprobs(logprobs: torch.Tensor, k: int, sampled: torch.Tensor,
                    tracked: tuple[torch.Tensor, torch.Tensor] | None = None) -> LogprobsTensors:
    """Sampled token's logprob and rank plus the top-``k`` logprobs of each row, or for the
    ``tracked`` rows (rows, ids [R, k]) the logprobs of their ids."""
    sampled = sampled.to(torch.int64).unsqueeze(1)
    sampled_lp = logprobs.gather(1, sampled)
    # Rank 1 is the most likely token; as vLLM counts it, tokens tied with the sampled one
    # rank before it (the count of tokens at least as likely).
    ranks = (logprobs >= sampled_lp).sum(dim=-1)
    if tracked is not None:
        rows, ids = tracked  # k columns (may exceed the vocabulary: ids repeat)
        if rows.numel() == logprobs.shape[0]:
            top_ids = ids
        else:
            top_ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1).indices
            top_ids = torch.cat([top_ids, top_ids[:, -1:].expand(-1, k - top_ids.shape[1])], 1)
            top_ids[rows] = ids
        lps = torch.cat([sampled_lp, logprobs.gather(1, top_ids)], dim=1)
        return LogprobsTensors(logprob_token_ids=torch.cat([sampled, top_ids], dim=1),
                               logprobs=lps, sampled_token_ranks=ranks)
    k = min(k, logprobs.shape[-1])
    if k > 0:
        top_lp, top_ids = logprobs.topk(k, dim=-1)
        ids = torch.cat([sampled, top_ids], dim=1)
        lps = torch.cat([sampled_lp, top_lp], dim=1)
    else:
        ids, lps = sampled, sampled_lp
    return LogprobsTensors(logprob_token_ids=ids, logprobs=lps, sampled_token_ranks=ranks)
