from __future__ import annotations

import math

import pytest
import torch

from cadence.sampling_params import SamplingParams
from cadence.worker.sampler import (
    Sampler,
    SamplingMetadata,
    seed_generator,
)
from cadence.worker.top_k_top_p import apply_top_k_top_p

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
    # Seeds are taken modulo 2**64, never rejected: 2**64 + 5 is 5 and -1 is 2**64 - 1.
    for seed, same in ((2**64 + 5, 5), (-1, 2**64 - 1), (-(2**63), 2**63), (2**200 + 9, 9)):
        seed_generator(g1, seed, 3)
        seed_generator(g2, same, 3)
        assert g1.initial_seed() == g2.initial_seed() < 2**63  # a valid torch seed
        assert torch.equal(torch.rand(8, generator=g1), torch.rand(8, generator=g2))
    for a, b in ((9, 6), (5, 2**63 + 5)):  # distinct modulo 2**64: unrelated streams
        seed_generator(g1, a, 3)
        seed_generator(g2, b, 3)
        assert g1.initial_seed() != g2.initial_seed()


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
    # A top_p so small that 1 - p rounds to 1 in float32: every token's mass before it is
    # below p only for none; the most likely token still survives (vLLM keeps it).
    close = torch.tensor([[0.0, 1.0, 5.0, 2.0]])
    out = apply_top_k_top_p(close.clone(), None, torch.tensor([1e-9]))
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


@pytest.mark.parametrize("mode", ["raw_logits", "processed_logprobs", "processed_logits"])
@pytest.mark.parametrize("fast", [False, True])
def test_logprobs_modes(mode: str, fast: bool) -> None:
    """vLLM's --logprobs-mode: raw_logits are the logits as given; the processed modes are of
    the logits as sampled: divided by the row's temperature (greedy rows by 1), everything
    outside its top-k at -inf."""
    n, k, top_k = 4, 6, 3
    temps = [0.5, 0.0, 1.5, 0.8]
    logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(17)) * 2
    md = _md(n, temperature=temps, top_k=[top_k, -1, top_k, top_k], max_num_logprobs=k,
             fast=fast)
    res = Sampler(mode)(logits, md)
    assert res.logprobs is not None
    if mode == "raw_logits":
        expected = logits
    else:
        scaled = logits / torch.tensor([t if t > 0 else 1.0 for t in temps]).unsqueeze(1)
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        masked = scaled.masked_fill((scaled < kth) & torch.tensor(
            [True, False, True, True]).unsqueeze(1), float("-inf"))
        expected = masked if mode == "processed_logits" else torch.log_softmax(masked, dim=-1)
    sampled = res.sampled_token_ids
    lp = res.logprobs
    assert torch.equal(lp.logprob_token_ids[:, 0], sampled)
    assert torch.allclose(lp.logprobs[:, 0], expected.gather(1, sampled.unsqueeze(1)).squeeze(1))
    top = expected.topk(k)
    assert torch.equal(lp.logprobs[:, 1:].isinf(), top.values.isinf())
    finite = top.values.isfinite()
    assert torch.allclose(lp.logprobs[:, 1:][finite], top.values[finite], atol=1e-5)
    # Every sampled token lies inside its row's top-k, so its processed value is finite.
    assert lp.logprobs[:, 0].isfinite().all()
    assert int(sampled[1]) == int(logits[1].argmax())


def test_processed_logprobs_of_an_all_greedy_batch_are_after_the_processors() -> None:
    """All rows greedy: no temperature or top-k applies; a banned token is at -inf."""
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(18))
    best = int(logits[0].argmax())
    res = Sampler("processed_logprobs")(
        logits, _md(2, temperature=0.0, max_num_logprobs=2, banned={0: [best]}))
    assert res.logprobs is not None
    expected = logits.clone()
    expected[0, best] = float("-inf")
    expected = torch.log_softmax(expected, dim=-1)
    assert torch.allclose(res.logprobs.logprobs[:, 1:], expected.topk(2).values)
    assert int(res.sampled_token_ids[0]) != best


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
    assert md.top_k is not None and md.top_k.tolist() == [0, 5, 0]
    assert md.top_p is not None and md.top_p.tolist() == pytest.approx([1.0, 1.0, 0.5])
    assert md.max_num_logprobs == 4
    # Row 0 is below min_tokens: its stop ids are banned; row 2 has reached min_tokens.
    assert md.banned_token_ids == {0: [2, 9]}
    # Under a grammar min_tokens bans nothing (docs/serving.md): the grammar may allow only
    # the end of sequence, and a row with no token left would fail.
    from cadence.sampling_params import StructuredOutputsParams

    guided = SamplingParams(temperature=1.0, min_tokens=3, stop_token_ids=[5],
                            structured_outputs=StructuredOutputsParams(regex="ab"))
    assert SamplingMetadata.from_params([guided], [0]).banned_token_ids == {}

    topk = [SamplingParams(temperature=0.0), SamplingParams(top_k=7), SamplingParams(top_k=3)]
    assert SamplingMetadata.from_params(topk, [0, 0, 0]).max_top_k == 7

    greedy = SamplingMetadata.from_params([SamplingParams(temperature=0.0)], [0])
    assert greedy.all_greedy and greedy.temperature is None
    assert greedy.top_k is None and greedy.top_p is None and greedy.max_num_logprobs is None


# --- Exact kept sets on hand-made distributions ---------------------------------------------------
#
# Semantics (vLLM's): top-k keeps the k most likely tokens plus every token tied with the k-th;
# top-p then keeps the smallest set of most likely tokens whose probability, renormalised over the
# top-k survivors, reaches top_p (so a token stays while the mass of the better ones is below
# top_p), and never fewer than one token. Temperature is applied first.
#
# PROBS[token] below: every value is a power of two, so the softmax of their logs, every
# cumulative sum and 1 - top_p are exact in float32 and the boundary cases are hit exactly.
# By decreasing probability: token 3 (1/2), 0 (1/4), 4 (1/8), 1 (1/16), then 2 and 5 tied (1/32).
# Cumulative mass in that order: 0.5, 0.75, 0.875, 0.9375, 0.96875, 1.
PROBS = [0.25, 0.0625, 0.03125, 0.5, 0.125, 0.03125]
ALL = frozenset(range(len(PROBS)))
# Every kept token in the cases below has a (renormalised) probability of at least 1/32, so a
# given one is missing from DRAWS independent draws with probability at most (31/32)**DRAWS,
# about 3e-28: sampled sets equal kept sets with overwhelming probability.
DRAWS = 2000

# (top_p, kept) worked out by hand from the cumulative masses above.
TOP_P_CASES: list[tuple[float, frozenset[int]]] = [
    (1e-6, frozenset({3})),  # at least the best token
    (0.3, frozenset({3})),
    (0.5, frozenset({3})),  # token 3 alone reaches 0.5 exactly: nothing more
    (0.51, frozenset({3, 0})),
    (0.75, frozenset({3, 0})),  # boundary: 0.5 + 0.25 == 0.75
    (0.76, frozenset({3, 0, 4})),
    (0.875, frozenset({3, 0, 4})),  # boundary
    (0.9, frozenset({3, 0, 4, 1})),
    (0.9375, frozenset({3, 0, 4, 1})),  # boundary
    (0.97, ALL),  # 0.96875 < 0.97: the second of the tied pair is needed too
    (1.0, ALL),
]

# (top_k, kept) by hand: ties with the k-th token are kept.
TOP_K_CASES: list[tuple[int, frozenset[int]]] = [
    (1, frozenset({3})),
    (2, frozenset({3, 0})),
    (3, frozenset({3, 0, 4})),
    (4, frozenset({3, 0, 4, 1})),
    (5, ALL),  # the 5th token (2 or 5) is tied with the 6th: both are kept
    (6, ALL),
]

# (top_k, top_p, kept): top-p over the top-k survivors, renormalised. The top-3 survivors have
# probabilities 4/7, 2/7, 1/7 (cumulative 0.571, 0.857, 1); the top-4 ones 8/15, 4/15, 2/15, 1/15
# (cumulative 0.533, 0.8, 0.933, 1); the top-2 ones 2/3, 1/3. Top-p on the raw probabilities would
# keep one more token in the first, second and fourth cases.
TOP_K_TOP_P_CASES: list[tuple[int, float, frozenset[int]]] = [
    (3, 0.55, frozenset({3})),
    (3, 0.8, frozenset({3, 0})),
    (3, 0.9, frozenset({3, 0, 4})),
    (4, 0.9, frozenset({3, 0, 4})),
    (2, 0.5, frozenset({3})),
    (2, 0.7, frozenset({3, 0})),
    (5, 0.97, ALL),
    (1, 0.99, frozenset({3})),
]


def _log_probs(probs: list[float]) -> torch.Tensor:
    return torch.tensor([math.log(p) for p in probs], dtype=torch.float32)


def _kept(row: torch.Tensor) -> frozenset[int]:
    return frozenset(torch.isfinite(row).nonzero().flatten().tolist())


def test_hand_made_distribution_is_exact_in_float32() -> None:
    """The premise of the boundary cases: the probabilities come out exactly as written."""
    row = _log_probs(PROBS)
    assert row.softmax(dim=-1).tolist() == PROBS
    assert row.sort().values.softmax(dim=-1).cumsum(dim=-1).tolist() == [
        0.03125, 0.0625, 0.125, 0.25, 0.5, 1.0
    ]


@pytest.mark.parametrize(("top_p", "kept"), TOP_P_CASES)
def test_top_p_mask_is_the_smallest_set_reaching_top_p(top_p: float, kept: frozenset[int]) -> None:
    row = _log_probs(PROBS)
    out = apply_top_k_top_p(row.unsqueeze(0).clone(), None, torch.tensor([top_p]))[0]
    assert _kept(out) == kept
    idx = sorted(kept)
    assert torch.equal(out[idx], row[idx])  # survivors keep their logits


@pytest.mark.parametrize(("top_k", "kept"), [*TOP_K_CASES, (-1, ALL), (0, ALL), (7, ALL)])
def test_top_k_mask_keeps_the_k_best_and_their_ties(top_k: int, kept: frozenset[int]) -> None:
    row = _log_probs(PROBS)
    out = apply_top_k_top_p(row.unsqueeze(0).clone(), torch.tensor([top_k]), None)[0]
    assert _kept(out) == kept


@pytest.mark.parametrize(("top_k", "top_p", "kept"), TOP_K_TOP_P_CASES)
def test_top_k_then_top_p_mask_renormalises(top_k: int, top_p: float, kept: frozenset[int]) -> None:
    row = _log_probs(PROBS)
    out = apply_top_k_top_p(row.unsqueeze(0).clone(), torch.tensor([top_k]), torch.tensor([top_p]))
    assert _kept(out[0]) == kept


def test_masks_of_rows_with_different_settings_in_one_batch() -> None:
    cases = [(-1, p, kept) for p, kept in TOP_P_CASES]
    cases += [(k, 1.0, kept) for k, kept in TOP_K_CASES]
    cases += TOP_K_TOP_P_CASES
    logits = _log_probs(PROBS).repeat(len(cases), 1)
    top_k = torch.tensor([k for k, _, _ in cases])
    top_p = torch.tensor([p for _, p, _ in cases])
    out = apply_top_k_top_p(logits, top_k, top_p)
    assert [_kept(row) for row in out] == [kept for _, _, kept in cases]


def test_top_p_ties_are_cut_by_count() -> None:
    """A cut inside a group of equal probabilities keeps exactly as many of the group as needed.
    Which ones vLLM leaves unspecified; cadence's two paths must agree (see the batch test)."""
    # PROBS with top_p 0.95: 0.9375 < 0.95 <= 0.96875, so one of the tied pair {2, 5}.
    out = apply_top_k_top_p(_log_probs(PROBS).unsqueeze(0), None, torch.tensor([0.95]))[0]
    kept = _kept(out)
    assert len(kept) == 5 and {3, 0, 4, 1} < kept
    # Four equal logits: each has probability exactly 1/4.
    flat = torch.zeros(3, 4)
    out = apply_top_k_top_p(flat, None, torch.tensor([0.5, 0.51, 1e-6]))
    assert [len(_kept(row)) for row in out] == [2, 3, 1]
    # Two tokens tied for best: top_k=1 keeps both, a tiny top_p keeps one of them.
    top2 = torch.tensor([[1.0, 0.0, 1.0, 0.0]]).repeat(2, 1)
    out = apply_top_k_top_p(top2, torch.tensor([1, -1]), torch.tensor([1.0, 1e-6]))
    assert _kept(out[0]) == {0, 2}
    assert len(_kept(out[1])) == 1 and _kept(out[1]) < {0, 2}


# The sampling paths do not expose their masks: sample every setting DRAWS times in one batch and
# compare the set of tokens seen with the hand-computed set.


def _sampled_sets(
    params: list[SamplingParams], logits_row: torch.Tensor, fast: bool
) -> list[frozenset[int]]:
    """Sample row i of a batch with ``params[i % len(params)]``; the tokens seen per setting."""
    n = len(params) * DRAWS
    batch = [params[i % len(params)] for i in range(n)]
    md = SamplingMetadata.from_params(batch, [0] * n)
    if fast:
        assert md.max_top_k is not None  # every random row has a top-k: the candidate path
    else:
        md.max_top_k = None  # the full sort
    torch.manual_seed(1234)
    tokens = Sampler()(logits_row.repeat(n, 1), md).sampled_token_ids.tolist()
    return [frozenset(tokens[i :: len(params)]) for i in range(len(params))]


def _top_p_params(top_p: float, fast: bool, temperature: float = 1.0) -> SamplingParams:
    # A top-k of the vocabulary's size keeps everything, and lets the batch take the fast path.
    top_k = len(PROBS) if fast else -1
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)


@pytest.mark.parametrize("fast", [False, True], ids=["full_sort", "top_k_path"])
def test_sampled_sets_equal_the_hand_computed_sets(fast: bool) -> None:
    row = _log_probs(PROBS)
    cases: list[tuple[SamplingParams, frozenset[int]]] = [
        (_top_p_params(p, fast), kept) for p, kept in TOP_P_CASES
    ]
    cases += [(SamplingParams(temperature=1.0, top_k=k), kept) for k, kept in TOP_K_CASES]
    cases += [
        (SamplingParams(temperature=1.0, top_k=k, top_p=p), kept)
        for k, p, kept in TOP_K_TOP_P_CASES
    ]
    # Temperature first: at 0.5 the probabilities are squared and renormalised (3: 0.749,
    # 0: 0.187, 4: 0.047, ...), so top_p 0.9 keeps {3, 0}; at temperature 1 it keeps four.
    cases.append((_top_p_params(0.9, fast, temperature=0.5), frozenset({3, 0})))
    cases.append((SamplingParams(temperature=0.0), frozenset({3})))  # greedy row in the batch
    seen = _sampled_sets([p for p, _ in cases], row, fast)
    assert seen == [kept for _, kept in cases]


@pytest.mark.parametrize("fast", [False, True], ids=["full_sort", "top_k_path"])
def test_sampled_sets_with_ties(fast: bool) -> None:
    # The top-p cut falls inside the tied pair {2, 5}: exactly one of them can be sampled.
    (seen,) = _sampled_sets([_top_p_params(0.95, fast)], _log_probs(PROBS), fast)
    assert len(seen) == 5 and {3, 0, 4, 1} < seen
    # Logits 2 > 1 = 1 = 1 > 0 (tokens 4 > 1, 2, 5 > 0, 3): top_k=2 ties with three tokens.
    row = torch.tensor([0.0, 1.0, 1.0, 0.0, 2.0, 1.0])
    k2, k1 = _sampled_sets(
        [SamplingParams(temperature=1.0, top_k=2), SamplingParams(temperature=1.0, top_k=1)],
        row,
        fast,
    )
    assert k2 == {4, 1, 2, 5}
    assert k1 == {4}


def test_seeded_top_k_and_top_p_are_batch_invariant_with_ties() -> None:
    """A seeded row samples the same token whichever path its batch takes, ties included."""
    n = 256
    # Logits on a coarse grid (as bf16 logits are): ties at the top-k threshold are common.
    grid = torch.randint(0, 8, (n, VOCAB), generator=torch.Generator().manual_seed(21)) * 0.25
    params = [
        SamplingParams(temperature=0.8, top_k=1 + i % 12, top_p=[1.0, 0.55, 0.85][i % 3], seed=i)
        for i in range(n)
    ]

    def run(extra: list[SamplingParams]) -> torch.Tensor:
        batch = params + extra
        gens = {i: torch.Generator() for i in range(n)}
        for i, g in gens.items():
            seed_generator(g, i, 5)
        md = SamplingMetadata.from_params(batch, [0] * len(batch), gens)
        assert (md.max_top_k is None) == bool(extra)
        logits = torch.cat([grid, torch.zeros(len(extra), VOCAB)])
        return Sampler()(logits, md).sampled_token_ids[:n]

    # Alone every random row has a top-k: the candidate path. With a row without top-k: the sort.
    alone = run([])
    mixed = run([SamplingParams(temperature=1.0)])
    assert torch.equal(alone, mixed)


def _seeded_stream(seed: int, steps: int) -> list[int]:
    """Tokens a seeded row draws on exactly uniform logits, re-seeded at every step as the runner
    does: the noise alone decides each token."""
    sampler = Sampler()
    gen = torch.Generator()
    tokens = []
    for step in range(steps):
        seed_generator(gen, seed, step)
        res = sampler(torch.zeros(1, VOCAB), _md(1, temperature=1.0, generators={0: gen}))
        tokens.append(int(res.sampled_token_ids[0]))
    return tokens


def test_seeded_row_draws_fresh_noise_at_every_step() -> None:
    tokens = _seeded_stream(123, 32)
    # 32 uniform draws over 64 tokens: about 25 distinct, 15 or fewer with probability 1.5e-7.
    # A row that drew the same noise at every step would repeat one token.
    assert len(set(tokens)) >= 16
    assert _seeded_stream(123, 32) == tokens
    other = _seeded_stream(124, 32)
    assert sum(a == b for a, b in zip(tokens, other)) <= 4  # about 0.5 expected


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_with_every_token_masked_are_flagged(temperature: float) -> None:
    """A row whose masks leave no token is flagged (its sampled id means nothing); steps with
    no mask that could empty a row are not inspected at all."""
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    sampler = Sampler()
    assert sampler(logits, _md(3, temperature)).no_token is None
    every = list(range(VOCAB))
    banned = {1: every, 2: every[:-1]}  # row 1: nothing left; row 2: the last id only
    out = sampler(logits, _md(3, temperature, banned=banned))
    assert out.no_token is not None and out.no_token.tolist() == [False, True, False]
    assert int(out.sampled_token_ids[2]) == VOCAB - 1


def test_a_sampled_token_ranks_after_the_tokens_tied_with_it() -> None:
    """vLLM's rank: how many tokens are at least as likely as the sampled one."""
    from cadence.worker.sampler import gather_logprobs

    logprobs = torch.log_softmax(torch.tensor([[1.0, 1.0, 0.0, 2.0]]), dim=-1)
    for sampled, rank in ((3, 1), (0, 3), (1, 3), (2, 4)):
        out = gather_logprobs(logprobs, 2, torch.tensor([sampled]))
        assert out.sampled_token_ranks.tolist() == [rank]


@pytest.mark.parametrize("fast", [False, True])
def test_unseeded_rows_beside_seeded_ones_follow_their_distribution(fast: bool) -> None:
    """A batch mixing seeded and unseeded random rows: every unseeded row draws fresh noise
    from the global generator (not only when no row is seeded)."""
    probs = [0.5, 0.25, 0.125, 0.125]
    logits = _log_probs(probs).repeat(3, 1)  # rows: unseeded, seeded, unseeded
    sampler, gen = Sampler(), torch.Generator()
    torch.manual_seed(0)
    counts = [[0] * len(probs) for _ in range(2)]
    draws = 800
    for step in range(draws):
        seed_generator(gen, 5, step)
        md = _md(3, top_k=[len(probs)] * 3 if fast else None, generators={1: gen}, fast=fast)
        tokens = sampler(logits, md).sampled_token_ids.tolist()
        counts[0][tokens[0]] += 1
        counts[1][tokens[2]] += 1
    # Each frequency within 5.5 standard deviations of its probability (a false alarm has odds
    # below 1e-7 per count).
    for row in counts:
        for p, c in zip(probs, row, strict=True):
            assert abs(c / draws - p) <= 5.5 * (p * (1 - p) / draws) ** 0.5, counts


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_tracked_token_ids_take_the_place_of_the_top_k(mode: str) -> None:
    """Rows with logprob_token_ids get the sampled token, then their ids in their order (any
    id, repeats too) with the row's logprobs of them; the other rows keep their top-k; the
    sampled token's rank is its rank in the row."""
    params = [SamplingParams(temperature=0.0, logprob_token_ids=[5, 63, 0]),
              SamplingParams(temperature=0.7, logprobs=4),
              SamplingParams(temperature=0.0, logprob_token_ids=[9, 9])]
    md = SamplingMetadata.from_params(params, [0, 0, 0])
    assert md.max_num_logprobs == 4 and md.tracked is not None
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(31)) * 2
    res = Sampler(mode)(logits, md)
    assert res.logprobs is not None
    ids, lps = res.logprobs.logprob_token_ids, res.logprobs.logprobs
    assert ids.shape == (3, 5)
    sampled = res.sampled_token_ids
    scaled = logits.clone()
    if mode == "processed_logprobs":
        scaled[1] /= 0.7
    ref = torch.log_softmax(scaled, dim=-1)
    assert ids[0, :4].tolist() == [int(sampled[0]), 5, 63, 0]
    assert ids[2, :3].tolist() == [int(sampled[2]), 9, 9]
    assert ids[1, 1:].tolist() == ref[1].topk(4).indices.tolist()
    assert torch.allclose(lps, ref.gather(1, ids), atol=1e-6)
    for row in range(3):
        expected_rank = int((ref[row] >= ref[row, sampled[row]]).sum())
        assert int(res.logprobs.sampled_token_ranks[row]) == expected_rank


def test_tracked_token_ids_of_every_row_need_no_top_k() -> None:
    """Every row tracked, more ids than the vocabulary has tokens (repeats): no top-k taken."""
    ids = list(range(VOCAB)) + [1, 2]
    params = [SamplingParams(temperature=0.0, logprob_token_ids=ids),
              SamplingParams(temperature=0.0, logprob_token_ids=[3])]
    md = SamplingMetadata.from_params(params, [0, 0])
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(32))
    res = Sampler()(logits, md)
    assert res.logprobs is not None
    ref = torch.log_softmax(logits, dim=-1)
    assert res.logprobs.logprob_token_ids[0, 1:].tolist() == ids
    # The shorter row is padded with its last id (the engine keeps its first 1 + 1 columns).
    assert res.logprobs.logprob_token_ids[1, 1:].tolist() == [3] * len(ids)
    assert torch.allclose(res.logprobs.logprobs,
                          ref.gather(1, res.logprobs.logprob_token_ids), atol=1e-6)
