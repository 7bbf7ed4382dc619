"""Token sampling from logits: greedy, temperature, top-k / top-p, per-request seeds, logprobs.

Mirrors vLLM v1's sampler. Every operation works row-wise, so a row's result depends only on its
own logits and (for seeded rows) its own generator, never on the rest of the batch. The device
path has no host synchronisation: tensors in, tensors out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from cadence.sampling_params import SamplingParams
from cadence.worker.output import LogprobsLists

_SAMPLING_EPS = 1e-5
_MAX_FAST_TOP_K = 1024  # above this a full sort is as cheap as torch.topk
_MASK64 = (1 << 64) - 1


@dataclass
class SamplingMetadata:
    """Per-step sampling inputs for the N rows of the logits."""

    temperature: torch.Tensor | None  # [N] float32; None when all rows are greedy
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None  # [N] float32; None when no row uses top-p
    top_k: torch.Tensor | None  # [N] int64; None when no row uses top-k (-1 = off)
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    max_num_logprobs: int | None = None  # None: no row wants logprobs
    # row -> ids masked to -inf (min_tokens: the stop/eos ids while output count < min_tokens)
    banned_token_ids: dict[int, list[int]] = field(default_factory=dict)
    # Host-side hint: every non-greedy row has a top-k of at most this. Lets the sampler take
    # the top-k candidates instead of sorting the whole vocabulary (same tokens, much faster).
    max_top_k: int | None = None

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
        wanted = [p.logprobs for p in params if p.logprobs is not None]
        banned: dict[int, list[int]] = {}
        for row, (p, n_out) in enumerate(zip(params, num_output_tokens, strict=True)):
            if n_out < p.min_tokens and p.all_stop_token_ids:
                banned[row] = sorted(p.all_stop_token_ids)
        return cls(
            temperature=temperature,
            all_greedy=all_greedy,
            all_random=all_random,
            top_p=top_p,
            top_k=top_k,
            generators=dict(generators or {}),
            max_num_logprobs=max(wanted) if wanted else None,
            banned_token_ids=banned,
            max_top_k=max_top_k,
        )


@dataclass
class SamplingRows:
    """The numeric sampling parameters of N rows, as the sampler's dtypes."""

    temperature: np.ndarray  # [N] float32
    top_p: np.ndarray  # [N] float32
    top_k: np.ndarray  # [N] int64, -1 = off

    @classmethod
    def of(cls, params: Sequence[SamplingParams]) -> SamplingRows:
        return cls(
            temperature=np.array([p.temperature for p in params], dtype=np.float32),
            top_p=np.array([p.top_p for p in params], dtype=np.float32),
            top_k=np.array([p.top_k for p in params], dtype=np.int64),
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
    """Samples one token per row of ``logits`` [N, V]."""

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        # Logprobs are of the raw logits (vLLM's default "raw_logprobs" mode).
        raw_logprobs = None
        if md.max_num_logprobs is not None:
            raw_logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)

        # Work on a float32 copy: the caller's logits are never modified.
        logits = logits.to(torch.float32, copy=True)
        if md.banned_token_ids:
            apply_banned_tokens(logits, md.banned_token_ids)
        sampled = self._sample(logits, md)

        logprobs = None
        if raw_logprobs is not None:
            assert md.max_num_logprobs is not None
            logprobs = gather_logprobs(raw_logprobs, md.max_num_logprobs, sampled)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    def _sample(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        greedy = None
        if not md.all_random:
            greedy = logits.argmax(dim=-1)
            if md.all_greedy:
                return greedy
        assert md.temperature is not None, "temperature is required unless all rows are greedy"
        temp = md.temperature.to(torch.float32)
        is_greedy = temp < _SAMPLING_EPS
        # Greedy rows take the argmax below; dividing them by 1 keeps their logits finite.
        logits.div_(torch.where(is_greedy, torch.ones_like(temp), temp).unsqueeze(1))
        kmax = md.max_top_k
        if md.top_k is not None and kmax is not None and 0 < kmax <= _MAX_FAST_TOP_K:
            random = sample_from_top_k(logits, md.top_k, kmax, md.top_p, md.generators)
        else:
            logits = apply_top_k_top_p(logits, md.top_k, md.top_p)
            random = exponential_race(logits.softmax(dim=-1), md.generators)
        if greedy is None:
            return random
        return torch.where(is_greedy, greedy, random)


def apply_banned_tokens(logits: torch.Tensor, banned: dict[int, list[int]]) -> None:
    """Set ``logits[row, id] = -inf`` for every banned (row, id), in place."""
    rows: list[int] = []
    cols: list[int] = []
    vocab = logits.shape[-1]
    for row, ids in banned.items():
        for tok in ids:
            if 0 <= tok < vocab:
                rows.append(row)
                cols.append(tok)
    if rows:
        idx = torch.tensor([rows, cols], dtype=torch.int64)
        if logits.is_cuda:
            # NOTE: pinned and non-blocking: a pageable copy would wait for the GPU.
            idx = idx.pin_memory().to(logits.device, non_blocking=True)
        logits.index_put_((idx[0], idx[1]), logits.new_full((), float("-inf")))


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Mask everything outside each row's top-k, then outside its top-p nucleus, with -inf.

    Both masks are computed on the ascending sort of the logits (vLLM's method). A row's top-k
    of -1 (or 0, or >= V) means no top-k; a top-p of 1 means no top-p. Ties at the top-k
    threshold are all kept.
    """
    if top_k is None and top_p is None:
        return logits
    vocab = logits.shape[-1]
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        k = top_k.to(device=logits.device, dtype=torch.int64)
        k = torch.where((k <= 0) | (k > vocab), torch.full_like(k, vocab), k)
        threshold = logits_sort.gather(1, (vocab - k).unsqueeze(1))
        logits_sort.masked_fill_(logits_sort < threshold, float("-inf"))
    if top_p is not None:
        p = top_p.to(device=logits.device, dtype=torch.float32)
        probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
        mask = probs_sum <= (1.0 - p).unsqueeze(1)
        mask[:, -1] = False  # the most likely token always survives
        logits_sort.masked_fill_(mask, float("-inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


def exponential_race(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Sample each row of ``probs`` as argmax(probs / E), E ~ Exp(1) i.i.d. per entry.

    Equivalent to sampling from the categorical distribution, without a host sync. Seeded rows
    draw their noise from their own generator.
    """
    q = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        q.exponential_()
    for row, gen in generators.items():
        q[row].exponential_(generator=gen)
    # Hazard: an exact 0 draw would give 0/0 = NaN on masked entries, and argmax picks NaN.
    q.clamp_(min=torch.finfo(q.dtype).tiny)
    return probs.div(q).argmax(dim=-1)


def sample_from_top_k(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    kmax: int,
    top_p: torch.Tensor | None,
    generators: dict[int, torch.Generator],
) -> torch.Tensor:
    """Top-k (then top-p) sampling over the ``kmax`` best candidates of each row.

    Same distribution as ``apply_top_k_top_p`` + ``exponential_race`` when every row's top-k is
    at most ``kmax`` (rows with top-k off use ``kmax``). Seeded rows draw noise for the whole
    vocabulary, as the full path does, so their tokens do not depend on ``kmax`` (the batch).
    """
    vocab = logits.shape[-1]
    kmax = min(kmax, vocab)
    vals, idx = logits.topk(kmax, dim=-1)  # descending
    k = top_k.to(device=logits.device, dtype=torch.int64)
    k = torch.where((k <= 0) | (k > kmax), torch.full_like(k, kmax), k)
    pos = torch.arange(kmax, device=logits.device)
    vals = vals.masked_fill(pos.unsqueeze(0) >= k.unsqueeze(1), float("-inf"))
    if top_p is not None:
        probs = vals.softmax(dim=-1)
        mass_above = probs.cumsum(dim=-1) - probs
        # Keep a candidate while the mass of better ones is below p (the best always stays).
        drop = mass_above >= top_p.to(device=logits.device, dtype=torch.float32).unsqueeze(1)
        drop[:, 0] = False
        vals = vals.masked_fill(drop, float("-inf"))
    probs = vals.softmax(dim=-1)
    q = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        q.exponential_()
    for row, gen in generators.items():
        full = torch.empty(vocab, dtype=probs.dtype, device=probs.device)
        full.exponential_(generator=gen)
        q[row] = full.gather(0, idx[row])
    q.clamp_(min=torch.finfo(q.dtype).tiny)
    choice = probs.div(q).argmax(dim=-1, keepdim=True)
    return idx.gather(1, choice).squeeze(1)


def gather_logprobs(logprobs: torch.Tensor, k: int, sampled: torch.Tensor) -> LogprobsTensors:
    """Sampled token's logprob and rank plus the top-``k`` logprobs of each row."""
    sampled = sampled.to(torch.int64).unsqueeze(1)
    sampled_lp = logprobs.gather(1, sampled)
    # Rank 1 is the most likely token; ties share the better rank.
    ranks = (logprobs > sampled_lp).sum(dim=-1) + 1
    k = min(k, logprobs.shape[-1])
    if k > 0:
        top_lp, top_ids = logprobs.topk(k, dim=-1)
        ids = torch.cat([sampled, top_ids], dim=1)
        lps = torch.cat([sampled_lp, top_lp], dim=1)
    else:
        ids, lps = sampled, sampled_lp
    return LogprobsTensors(logprob_token_ids=ids, logprobs=lps, sampled_token_ranks=ranks)
