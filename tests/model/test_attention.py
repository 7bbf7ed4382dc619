"""The reference attention backend against dense causal attention computed from scratch."""

from __future__ import annotations

import pytest
import torch

from cadence.model.attention import TorchAttentionBackend, write_kv_cache
from tests.model.helpers import BLOCK_SIZE, DUMMY_SLOT, NUM_BLOCKS, Chunk, make_batch

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8
SCALE = HEAD_DIM**-0.5


def _dense_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int = 0, softcap: float = 0.0
) -> torch.Tensor:
    """Full-sequence attention for one sequence; q [n, H, d], k/v [n, KV, d]; last rows = queries.
    ``window`` > 0: each query also sees at most its last ``window`` keys (itself included);
    ``softcap`` > 0: scores s become softcap * tanh(s / softcap)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * SCALE
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    n_q, n_k = q.shape[0], k.shape[0]
    allowed = torch.ones(n_q, n_k).tril(diagonal=n_k - n_q).bool()
    if window > 0:
        allowed &= torch.ones(n_q, n_k).triu(diagonal=n_k - n_q - window + 1).bool()
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double()).float()


def _cache(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.full((2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM), float("nan"), dtype=dtype)


@pytest.mark.parametrize(("window", "softcap"), [(0, 0), (1, 0), (4, 0), (100, 0), (0, 0.3), (4, 0.3)])
def test_prefill_then_chunk_then_decode_match_dense_attention(window, softcap):
    gen = torch.Generator().manual_seed(0)
    lengths, tables = [3, 9, 14], [[5, 2], [9, 1, 7], [4, 11, 3, 8]]
    full_q = [torch.randn(n, HEADS, HEAD_DIM, generator=gen) for n in lengths]
    full_k = [torch.randn(n, KV_HEADS, HEAD_DIM, generator=gen) for n in lengths]
    full_v = [torch.randn(n, KV_HEADS, HEAD_DIM, generator=gen) for n in lengths]
    backend, cache = TorchAttentionBackend(), _cache()
    # Three passes per sequence: [0, a), [a, n - 1), [n - 1, n).
    cuts = [(1, 2), (4, 8), (6, 13)]
    for p in range(3):
        chunks, qs, ks, vs, expected = [], [], [], [], []
        for i, n in enumerate(lengths):
            bounds = (0, *cuts[i], n)
            lo, hi = bounds[p], bounds[p + 1]
            chunks.append(Chunk(list(range(lo, hi)), lo, tables[i]))
            qs.append(full_q[i][lo:hi])
            ks.append(full_k[i][lo:hi])
            vs.append(full_v[i][lo:hi])
            expected.append(
                _dense_causal(full_q[i][lo:hi], full_k[i][:hi], full_v[i][:hi], window, softcap)
            )
        md = make_batch(chunks).metadata
        out = backend.forward(
            torch.cat(qs), torch.cat(ks), torch.cat(vs), cache, md, SCALE, window, softcap
        )
        torch.testing.assert_close(out, torch.cat(expected), atol=1e-5, rtol=1e-5)


def test_padding_rows_write_the_dummy_slot_and_stay_zero():
    gen = torch.Generator().manual_seed(1)
    md = make_batch([Chunk([0, 1, 2], 0, [3])], num_padding_tokens=2).metadata
    q = torch.randn(5, HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(5, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(5, KV_HEADS, HEAD_DIM, generator=gen)
    cache = _cache()
    out = TorchAttentionBackend().forward(q, k, v, cache, md, SCALE)
    torch.testing.assert_close(out[:3], _dense_causal(q[:3], k[:3], v[:3]), atol=1e-5, rtol=1e-5)
    assert torch.equal(out[3:], torch.zeros_like(out[3:]))
    assert torch.equal(cache[0].view(-1, KV_HEADS, HEAD_DIM)[DUMMY_SLOT], k[4])


def test_write_kv_cache_skips_negative_slots():
    cache = torch.zeros(2, 4, 2, 1, 3)
    k = torch.arange(9.0).view(3, 1, 3)
    v = -k
    write_kv_cache(k, v, cache, torch.tensor([5, -1, 0]))
    flat_k, flat_v = cache[0].view(-1, 1, 3), cache[1].view(-1, 1, 3)
    assert torch.equal(flat_k[5], k[0]) and torch.equal(flat_k[0], k[2])
    assert torch.equal(flat_v[5], v[0]) and torch.equal(flat_v[0], v[2])
    assert int((flat_k != 0).any(-1).sum()) == 2  # token 1 went nowhere


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_keeps_dtype_and_stays_close(dtype):
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(6, HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(6, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(6, KV_HEADS, HEAD_DIM, generator=gen)
    md = make_batch([Chunk(list(range(6)), 0, [2, 6])]).metadata
    out = TorchAttentionBackend().forward(
        q.to(dtype), k.to(dtype), v.to(dtype), _cache(dtype), md, SCALE
    )
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), _dense_causal(q, k, v), atol=3e-2, rtol=3e-2)


def test_device_metadata_is_enough_without_host_copies():
    gen = torch.Generator().manual_seed(3)
    md = make_batch([Chunk([0, 1, 2, 3, 4], 0, [7, 1])]).metadata
    md.query_start_loc_cpu = None
    md.seq_lens_cpu = None
    q = torch.randn(5, HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(5, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(5, KV_HEADS, HEAD_DIM, generator=gen)
    out = TorchAttentionBackend().forward(q, k, v, _cache(), md, SCALE)
    torch.testing.assert_close(out, _dense_causal(q, k, v), atol=1e-5, rtol=1e-5)


def test_fp8_cache_dequantizes_keys_and_values_with_their_own_scales():
    """An e4m3 cache holds k / k_scale and v / v_scale; attention reads each back times its
    own scale."""
    fp8 = torch.float8_e4m3fn
    k_scale, v_scale = 0.5, 2.0
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(6, HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(6, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(6, KV_HEADS, HEAD_DIM, generator=gen) * 4
    md = make_batch([Chunk(list(range(6)), 0, [2, 6])]).metadata
    cache = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=fp8)
    out = TorchAttentionBackend().forward(q, k, v, cache, md, SCALE, k_scale=k_scale,
                                          v_scale=v_scale)
    k_read = (k / k_scale).to(fp8).float() * k_scale
    v_read = (v / v_scale).to(fp8).float() * v_scale
    torch.testing.assert_close(out, _dense_causal(q, k_read, v_read), atol=1e-4, rtol=1e-4)
