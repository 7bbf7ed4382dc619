from __future__ import annotations

import math

import pytest
import torch

from cadence.sampling_params import SamplingParams
from cadence.worker.sampler import (
    Sampler,
    SamplingMetadata,
    apply_top_k_top_p,
    seed_generator,
)

VOCAB = 64


def _md(
    n: int,
    temperature: float | list[float] = 1.0,
    top_k: list[int] | None = None,
    top_p: list[float] | None = None,
    generators: dict[int, torch.Generator] | None = None,
    max_num_logprobs: int | None = None,
    banned: dict[int, list[int]] | None = None,
    fast: bool = False,
) -> SamplingMetadata:
    temps = [temperature] * n if isinstance(temperature, float) else temperature
    greedy = [t == 0.0 for t in temps]
    return SamplingMetadata(
        temperature=None if all(greedy) else torch.tensor(temps, dtype=torch.float32),
        all_greedy=all(greedy),
        all_random=not any(greedy),
        top_p=None if top_p is None else torch.tensor(top_p, dtype=torch.float32),
        top_k=None if top_k is None else torch.tensor(top_k, dtype=torch.int64),
        generators=generators or {},
        max_num_logprobs=max_num_logprobs,
        banned_token_ids=banned or {},
        max_top_k=max(top_k) if fast and top_k else None,
    )


def _step_logits(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(VOCAB, generator=g) * 0.5  # flat enough that draws really vary


def _seeded_run(order: list[str], seeds: dict[str, int], steps: int) -> dict[str, list[int]]:
    """Sample ``steps`` tokens for rows named in ``order``; rows in ``seeds`` are seeded."""
    sampler = Sampler()
    gens = {name: torch.Generator() for name in seeds}
    out: dict[str, list[int]] = {name: [] for name in order}
    for step in range(steps):
        logits = _step_logits(step).repeat(len(order), 1)
        generators = {}
        for row, name in enumerate(order):
            if name in seeds:
                seed_generator(gens[name], seeds[name], step)
                generators[row] = gens[name]
        res = sampler(logits, _md(len(order), generators=generators))
        for row, name in enumerate(order):
            out[name].append(int(res.sampled_token_ids[row]))
    return out


def test_same_seed_same_tokens_regardless_of_batch() -> None:
    seeds = {"a": 7, "b": 9}
    alone_a = _seeded_run(["a"], {"a": 7}, steps=40)["a"]
    batched = _seeded_run(["x", "a", "y", "b"], seeds, steps=40)
    reordered = _seeded_run(["b", "z", "a"], seeds, steps=40)
    assert batched["a"] == alone_a
    assert reordered["a"] == alone_a
    assert reordered["b"] == batched["b"]
    # Different seeds (and unseeded rows) give different streams.
    assert batched["a"] != batched["b"]
    assert len(set(alone_a)) > 5  # the draws really are random


def test_seed_generator_is_deterministic_and_step_dependent() -> None:
    g1, g2 = torch.Generator(), torch.Generator()
    seed_generator(g1, 123, 4)
    seed_generator(g2, 123, 4)
    assert torch.equal(torch.rand(8, generator=g1), torch.rand(8, generator=g2))
    seed_generator(g1, 123, 5)
    seed_generator(g2, 124, 4)
    assert not torch.equal(torch.rand(8, generator=g1), torch.rand(8, generator=g2))
    seed_generator(g1, 2**64 + 5, 0)  # huge seeds are reduced, never rejected
    seed_generator(g1, -1, 0)


@pytest.mark.parametrize("fast", [False, True])
def test_top_k_1_equals_greedy(fast: bool) -> None:
    logits = torch.randn(32, VOCAB, generator=torch.Generator().manual_seed(0))
    res = Sampler()(logits, _md(32, temperature=1.7, top_k=[1] * 32, fast=fast))
    assert torch.equal(res.sampled_token_ids, logits.argmax(dim=-1))


def test_greedy_rows_mixed_with_random_rows() -> None:
    n = 200
    logits = _step_logits(0).repeat(n, 1)
    temps = [0.0 if i % 2 == 0 else 1.0 for i in range(n)]
    res = Sampler()(logits, _md(n, temperature=temps))
    tokens = res.sampled_token_ids
    assert tokens.dtype == torch.int64
    assert torch.all(tokens[0::2] == int(logits[0].argmax()))
    assert len(set(tokens[1::2].tolist())) > 10


def test_all_greedy_needs_no_temperature() -> None:
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(3))
    res = Sampler()(logits, _md(5, temperature=0.0))
    assert torch.equal(res.sampled_token_ids, logits.argmax(dim=-1))


def _draws(logits_row: torch.Tensor, n: int, **kw: object) -> torch.Tensor:
    torch.manual_seed(0)
    return Sampler()(logits_row.repeat(n, 1), _md(n, **kw)).sampled_token_ids  # type: ignore[arg-type]


@pytest.mark.parametrize("fast", [False, True])
def test_top_k_never_samples_outside_the_top_k(fast: bool) -> None:
    row = _step_logits(1) * 3
    draws = _draws(row, 5000, temperature=1.0, top_k=[5] * 5000, fast=fast)
    allowed = set(row.topk(5).indices.tolist())
    seen = set(draws.tolist())
    assert seen <= allowed
    assert seen == allowed  # every allowed token turns up in 5000 draws


def _nucleus(row: torch.Tensor, p: float) -> set[int]:
    probs = torch.softmax(row.double(), dim=-1)
    order = probs.argsort(descending=True)
    keep, total = [], 0.0
    for tok in order.tolist():
        keep.append(tok)
        total += float(probs[tok])
        if total >= p:
            break
    return set(keep)


def test_top_p_never_samples_outside_the_nucleus() -> None:
    row = _step_logits(2) * 3
    p = 0.6
    draws = _draws(row, 5000, temperature=1.0, top_p=[p] * 5000)
    allowed = _nucleus(row, p)
    assert 1 < len(allowed) < VOCAB
    assert set(draws.tolist()) <= allowed


@pytest.mark.parametrize("fast", [False, True])
def test_top_k_then_top_p_and_temperature(fast: bool) -> None:
    row = _step_logits(3) * 3
    temp = 0.7
    draws = _draws(row, 4000, temperature=temp, top_k=[8] * 4000, top_p=[0.5] * 4000, fast=fast)
    scaled = row / temp
    top8 = scaled.topk(8)
    masked = torch.full_like(scaled, float("-inf"))
    masked[top8.indices] = top8.values
    assert set(draws.tolist()) <= _nucleus(masked, 0.5)


def test_frequencies_follow_the_tempered_distribution() -> None:
    row = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -5.0])
    n = 20000
    draws = _draws(row, n, temperature=0.8)
    freq = torch.bincount(draws, minlength=6).double() / n
    expected = torch.softmax(row.double() / 0.8, dim=-1)
    assert torch.allclose(freq, expected, atol=0.015)


@pytest.mark.parametrize("top_p", [None, 0.7])
def test_top_k_fast_path_matches_the_full_sort(top_p: float | None) -> None:
    """Seeded rows: the top-k candidate path and the full-vocabulary path pick the same token,
    whatever the batch's largest top-k."""
    n = 64
    logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(11)) * 2
    ks = [1 + (i % 9) for i in range(n)]
    temps = [0.0 if i % 7 == 0 else 0.9 for i in range(n)]
    ps = None if top_p is None else [top_p] * n
    results = []
    for fast, extra_k in [(False, 0), (True, 0), (True, 20)]:
        gens = {i: torch.Generator() for i in range(n)}
        for i, g in gens.items():
            seed_generator(g, 100 + i, 3)
        md = _md(n, temperature=temps, top_k=ks, top_p=ps, generators=gens, fast=fast)
        if extra_k:
            md.max_top_k = max(ks) + extra_k
        results.append(Sampler()(logits, md).sampled_token_ids)
    assert torch.equal(results[0], results[1])
    assert torch.equal(results[0], results[2])


def test_top_p_keeps_at_least_one_token() -> None:
    logits = torch.tensor([[0.0, 0.0, 10.0, 0.0]])
    out = apply_top_k_top_p(logits.clone(), None, torch.tensor([1e-6]))
    assert torch.isfinite(out).tolist() == [[False, False, True, False]]


def test_top_k_minus_one_and_large_k_disable_top_k() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(5))
    out = apply_top_k_top_p(logits.clone(), torch.tensor([-1, VOCAB + 10, 3]), None)
    assert torch.equal(out[:2], logits[:2])
    assert int(torch.isfinite(out[2]).sum()) == 3


def test_banned_ids_are_never_sampled() -> None:
    row = _step_logits(4)
    best = row.topk(3).indices.tolist()
    n = 3000
    banned = {i: best for i in range(n)}
    temps = [0.0] + [1.0] * (n - 1)
    torch.manual_seed(1)
    res = Sampler()(row.repeat(n, 1), _md(n, temperature=temps, banned=banned))
    sampled = set(res.sampled_token_ids.tolist())
    assert not sampled & set(best)
    masked = row.clone()
    masked[best] = float("-inf")
    assert int(res.sampled_token_ids[0]) == int(masked.argmax())  # greedy row: next best


def test_caller_logits_are_not_modified() -> None:
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(6))
    before = logits.clone()
    Sampler()(logits, _md(4, temperature=0.5, top_k=[3] * 4, top_p=[0.9] * 4, banned={0: [1]}))
    assert torch.equal(logits, before)


@pytest.mark.parametrize("temperature", [0.0, 0.6])
def test_logprobs_are_raw_log_softmax_with_ranks(temperature: float) -> None:
    n, k = 6, 4
    logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(7)) * 2
    md = _md(n, temperature=temperature, top_k=[5] * n, max_num_logprobs=k)
    res = Sampler()(logits, md)
    assert res.logprobs is not None
    ref = torch.log_softmax(logits, dim=-1)
    sampled = res.sampled_token_ids
    lp = res.logprobs
    assert lp.logprob_token_ids.shape == (n, k + 1)
    assert torch.equal(lp.logprob_token_ids[:, 0], sampled)
    assert torch.allclose(lp.logprobs[:, 0], ref.gather(1, sampled.unsqueeze(1)).squeeze(1))
    top = ref.topk(k)
    assert torch.equal(lp.logprob_token_ids[:, 1:], top.indices)
    assert torch.allclose(lp.logprobs[:, 1:], top.values)
    order = ref.argsort(dim=-1, descending=True)
    for i in range(n):
        expected_rank = order[i].tolist().index(int(sampled[i])) + 1
        assert int(lp.sampled_token_ranks[i]) == expected_rank
    lists = lp.tolists()
    assert lists.sampled_token_ranks == lp.sampled_token_ranks.tolist()
    assert math.isclose(lists.logprobs[0][0], float(lp.logprobs[0, 0]), rel_tol=1e-6)


def test_zero_logprobs_gives_only_the_sampled_token() -> None:
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(8))
    res = Sampler()(logits, _md(2, temperature=0.0, max_num_logprobs=0))
    assert res.logprobs is not None
    assert res.logprobs.logprob_token_ids.shape == (2, 1)
    assert torch.equal(res.logprobs.sampled_token_ranks, torch.tensor([1, 1]))


def test_metadata_from_params() -> None:
    params = [
        SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[9]),
        SamplingParams(temperature=0.8, top_k=5, logprobs=2),
        SamplingParams(temperature=1.0, top_p=0.5, logprobs=4, min_tokens=1),
    ]
    params[0].all_stop_token_ids |= {2}
    md = SamplingMetadata.from_params(params, num_output_tokens=[2, 0, 1])
    assert md.max_top_k is None  # row 2 samples without top-k
    assert not md.all_greedy and not md.all_random
    assert md.temperature is not None and md.temperature.tolist() == pytest.approx([0, 0.8, 1])
    assert md.top_k is not None and md.top_k.tolist() == [-1, 5, -1]
    assert md.top_p is not None and md.top_p.tolist() == pytest.approx([1.0, 1.0, 0.5])
    assert md.max_num_logprobs == 4
    # Row 0 is below min_tokens: its stop ids are banned; row 2 has reached min_tokens.
    assert md.banned_token_ids == {0: [2, 9]}

    topk = [SamplingParams(temperature=0.0), SamplingParams(top_k=7), SamplingParams(top_k=3)]
    assert SamplingMetadata.from_params(topk, [0, 0, 0]).max_top_k == 7

    greedy = SamplingMetadata.from_params([SamplingParams(temperature=0.0)], [0])
    assert greedy.all_greedy and greedy.temperature is None
    assert greedy.top_k is None and greedy.top_p is None and greedy.max_num_logprobs is None
