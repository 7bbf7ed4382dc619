"""A pass that returns its sequences' last tokens only (``OutputRows``): the same states as
the whole pass at those tokens, the same KV cache, and a last layer that runs its MLP for
those rows alone (layers that cannot, Gemma's, run every token and keep the rows)."""

from __future__ import annotations

import random

import pytest
import torch

from tests.model.helpers import (
    VOCAB,
    Chunk,
    hf_logits,
    last_rows,
    load_ours,
    make_batch,
    make_hf_model,
    new_kv_caches,
    save_hf_model,
)

ATOL = 1e-4


@pytest.fixture(scope="module", params=["qwen3", "llama-bias", "qwen3-moe", "gemma2"])
def model_pair(request, tmp_path_factory):
    hf = make_hf_model(request.param, tie=False, seed=3)
    return request.param, hf, load_ours(save_hf_model(hf, tmp_path_factory.mktemp("m")))


def _prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(n)] for n in lengths]


def _tables(num_seqs: int) -> list[list[int]]:
    pool = list(range(1, 1 + 6 * num_seqs))
    random.Random(num_seqs).shuffle(pool)
    return [pool[6 * i : 6 * i + 6] for i in range(num_seqs)]


def _mlp_rows(model) -> list[int]:
    """Rows each call of the last layer's MLP sees (a forward hook on it)."""
    seen: list[int] = []
    mlp = model.model.layers[-1].mlp
    target = getattr(mlp, "gate_up_proj", mlp)  # a dense MLP calls its projections itself
    target.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[0]))
    return seen


@torch.no_grad()
def test_rows_give_the_whole_pass_states_at_each_last_token(model_pair):
    family, hf, model = model_pair
    prompts = _prompts(7, (9, 14, 4))
    tables = _tables(3)
    splits = (5, 3, 0)  # a cached first chunk for two of them, none for the third
    model.bind_kv_caches(new_kv_caches(model))
    first = [Chunk(p[:s], 0, t) for p, s, t in zip(prompts, splits, tables, strict=True) if s]
    model(*_args(make_batch(first)))
    batch = make_batch([Chunk(p[s:], s, t) for p, s, t in zip(prompts, splits, tables,
                                                            strict=True)], num_padding_tokens=3)
    caches = [c.clone() for c in model._kv_caches]
    whole = model(*_args(batch))
    after_whole = [c.clone() for c in model._kv_caches]
    for cache, saved in zip(model._kv_caches, caches, strict=True):
        cache.copy_(saved)
    rows = last_rows(batch)
    assert rows.count == 3
    hook_rows = _mlp_rows(model) if family != "gemma2" else None
    ours = model(*_args(batch), rows)
    assert ours.shape == (3, whole.shape[1])
    torch.testing.assert_close(ours, whole[rows.index.long()], atol=ATOL, rtol=0)
    # Every token's K/V is stored in every layer, the last one included.
    for got, want in zip(model._kv_caches, after_whole, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0, equal_nan=True)
    if hook_rows is not None:
        assert hook_rows == [3]  # the last layer's MLP ran for the three rows alone
    expected = torch.stack([hf_logits(hf, p)[-1] for p in prompts])
    assert expected.abs().max() > 1.0
    torch.testing.assert_close(model.compute_logits(ours), expected, atol=ATOL, rtol=0)


@torch.no_grad()
def test_rows_may_be_the_first_sequences_only(model_pair):
    """A graph of a lone prompt asks for one row of a batch laid out for several."""
    _, hf, model = model_pair
    prompts = _prompts(8, (12, 6))
    model.bind_kv_caches(new_kv_caches(model))
    batch = make_batch([Chunk(p, 0, t) for p, t in zip(prompts, _tables(2), strict=True)])
    ours = model(*_args(batch), last_rows(batch, 1))
    assert ours.shape[0] == 1
    torch.testing.assert_close(model.compute_logits(ours)[0], hf_logits(hf, prompts[0])[-1],
                               atol=ATOL, rtol=0)


def _args(batch):
    return batch.input_ids, batch.positions, batch.metadata
