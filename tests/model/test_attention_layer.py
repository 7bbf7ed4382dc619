"""SelfAttention over the torch backend against a float64 computation of its definition: the qkv
split, the q/k norms (Gemma's ``1 + w``), rotate-half RoPE, causal grouped-query attention with
the layer's window, scale and soft cap, an FP8 cache's own key and value scales, output rows,
and the permutation of each head's q/k dimensions."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from cadence.model.arch import DecoderArch
from cadence.model.attention import TorchAttentionBackend
from cadence.model.attention_layer import SelfAttention
from tests.model.causal_reference import causal_reference
from tests.model.helpers import BLOCK_SIZE, NUM_BLOCKS, Chunk, last_rows, make_batch

FP8 = torch.float8_e4m3fn
# Three prompts from position 0 of a pass, and their blocks (BLOCK_SIZE tokens each).
LENGTHS = [9, 3, 7]
TABLES = [[5, 2, 9], [7], [4, 11]]
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MAX_POS = 24, 4, 2, 8, 64
# An eps of the order of the mean square, so that a dropped or changed eps shows.
EPS = 0.3


def _arch(**fields: object) -> DecoderArch:
    base: dict[str, object] = dict(
        architecture="Qwen3ForCausalLM", vocab_size=32, hidden_size=HIDDEN,
        intermediate_size=32, num_layers=2, num_heads=HEADS, num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM, rms_norm_eps=EPS, qkv_bias=False, o_bias=False, mlp_bias=False,
        qk_norm=True, tie_word_embeddings=False, max_position_embeddings=MAX_POS,
    )
    return DecoderArch(**{**base, **fields})


@dataclass(frozen=True)
class Case:
    """An architecture and what its layers must do, written out here: Gemma's (1 + w) norms,
    each layer's window, the score scale and the soft cap."""

    arch: DecoderArch
    gemma: bool = False
    windows: tuple[int, int] = (0, 0)
    scale: float = HEAD_DIM**-0.5
    softcap: float = 0.0


CASES = {
    # Fused q/k norms (the backend applies them), no window.
    "qwen3": Case(_arch()),
    # q/k/v biases, no q/k norms.
    "bias": Case(_arch(architecture="LlamaForCausalLM", qkv_bias=True, qk_norm=False)),
    # Gemma 2: no q/k norms, a window on even layers, a soft cap and its own score scale.
    "gemma2": Case(_arch(architecture="Gemma2ForCausalLM", qk_norm=False, gemma=True,
                         sliding_window=5, layer_sliding=(True, False), attn_scale=0.2,
                         attn_softcap=1.5),
                   gemma=True, windows=(5, 0), scale=0.2, softcap=1.5),
    # Gemma 3: (1 + w) q/k norms run by the layer; layer 0 full, layer 1 sliding.
    "gemma3": Case(_arch(architecture="Gemma3ForCausalLM", gemma=True, sliding_window=4,
                         layer_sliding=(False, True), attn_scale=0.3),
                   gemma=True, windows=(0, 4), scale=0.3),
}


def _layer(arch: DecoderArch, layer: int = 0, seed: int = 0) -> SelfAttention:
    sa = SelfAttention(arch, TorchAttentionBackend(), layer)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sa.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            # Norm weights far from 1 (from 0 for Gemma's 1 + w), distinct for q and k.
            p.copy_(0.6 * noise if "norm" in name else 0.5 * noise)
    return sa


def _cos_sin(identity: bool = False) -> torch.Tensor:
    """A rotate-half table, ``[MAX_POS, HEAD_DIM]``: cos in the first half, sin in the second
    (all angles 0 with ``identity``)."""
    inv_freq = 1.0 / (50.0 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))
    angles = torch.arange(MAX_POS, dtype=torch.float64)[:, None] * inv_freq[None, :]
    if identity:
        angles = torch.zeros_like(angles)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def _heads(sa: SelfAttention, x: torch.Tensor, gemma: bool) -> tuple[torch.Tensor, ...]:
    """q ``[T, H, d]``, k and v ``[T, KV, d]`` in float64, q and k normed (not rotated; the
    norm scales by ``1 + w`` for ``gemma``)."""
    w = sa.qkv_proj.weight.double()
    qkv = x.double() @ w.T
    if sa.qkv_proj.bias is not None:
        qkv = qkv + sa.qkv_proj.bias.double()
    q_size, kv_size = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    q = qkv[:, :q_size].reshape(-1, HEADS, HEAD_DIM)
    k = qkv[:, q_size : q_size + kv_size].reshape(-1, KV_HEADS, HEAD_DIM)
    v = qkv[:, q_size + kv_size :].reshape(-1, KV_HEADS, HEAD_DIM)
    if sa.q_norm is not None:

        def norm(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            scale = (1.0 + weight.double()) if gemma else weight.double()
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + EPS) * scale

        q, k = norm(q, sa.q_norm.weight), norm(k, sa.k_norm.weight)
    return q, k, v


def _rotate(t: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    cos, sin = cos_sin.double()[positions].chunk(2, dim=-1)
    cos, sin = cos[:, None], sin[:, None]
    t1, t2 = t.chunk(2, dim=-1)
    return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1)


def _reference(sa: SelfAttention, x: torch.Tensor, cos_sin: torch.Tensor, case: Case,
               layer: int, kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The heads' outputs ``[T, H * d]`` of prompts of ``LENGTHS`` from position 0 in float64
    (layer ``layer`` of ``case``); ``kv``: each token's (rotated) key and value to attend
    instead of the exact ones."""
    q, k, v = _heads(sa, x, case.gemma)
    window, scale, softcap = case.windows[layer], case.scale, case.softcap
    outs, start = [], 0
    for n in LENGTHS:
        pos = torch.arange(n)
        qs = _rotate(q[start : start + n], pos, cos_sin)
        ks = _rotate(k[start : start + n], pos, cos_sin)
        vs = v[start : start + n]
        if kv is not None:
            ks, vs = kv[0][start : start + n], kv[1][start : start + n]
        outs.append(causal_reference(qs, ks, vs, scale, window, softcap).reshape(n, -1))
        start += n
    return torch.cat(outs)



def _pass(seed: int = 1, cache_dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(seed)
    batch = make_batch([Chunk(list(range(n)), 0, t) for n, t in zip(LENGTHS, TABLES,
                                                                     strict=True)])
    x = torch.randn(sum(LENGTHS), HIDDEN, generator=gen)
    cache = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=cache_dtype)
    return batch, x, cache


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("family", list(CASES))
@torch.no_grad()
def test_attend_heads_is_the_definition_in_float64(family, layer):
    case = CASES[family]
    sa = _layer(case.arch, layer)
    batch, x, cache = _pass()
    cos_sin = _cos_sin()
    got = sa.attend_heads(sa.qkv_proj(x), batch.positions, cos_sin, cache, batch.metadata)
    want = _reference(sa, x, cos_sin, case, layer)
    assert got.shape == (sum(LENGTHS), HEADS * HEAD_DIM)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("family", ["qwen3", "gemma2"])
@torch.no_grad()
def test_rows_attend_their_own_tokens_and_every_token_is_stored(family):
    """With output rows (each sequence's last token, or the first sequences' only), each row's
    output is its own token's, and every token's K/V still lands in the cache."""
    case = CASES[family]
    sa = _layer(case.arch, 0, seed=3)
    batch, x, cache = _pass(seed=4)
    cos_sin = _cos_sin()
    want = _reference(sa, x, cos_sin, case, 0)
    _, k, v = _heads(sa, x, case.gemma)
    k = _rotate(k, batch.positions, cos_sin)
    slots = batch.metadata.slot_mapping
    for count in (3, 2):
        rows = last_rows(batch, count)
        cache.zero_()
        got = sa.attend_heads(sa.qkv_proj(x), batch.positions, cos_sin, cache, batch.metadata,
                              rows)
        assert got.shape == (count, HEADS * HEAD_DIM)
        last = torch.tensor(LENGTHS).cumsum(0)[:count] - 1
        torch.testing.assert_close(got.double(), want[last], atol=2e-5, rtol=2e-5)
        stored_k = cache[0].reshape(-1, KV_HEADS, HEAD_DIM)[slots]
        stored_v = cache[1].reshape(-1, KV_HEADS, HEAD_DIM)[slots]
        torch.testing.assert_close(stored_k.double(), k, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(stored_v.double(), v, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("family", ["qwen3", "bias"])
@torch.no_grad()
def test_an_fp8_cache_stores_and_reads_keys_and_values_with_their_own_scales(family):
    """The layer's k_scale is the keys' and its v_scale the values' (a checkpoint's
    ``self_attn.k_scale`` / ``v_scale``): the cache holds k / k_scale and v / v_scale, and
    attention reads them back times the same scales."""
    case = CASES[family]
    sa = _layer(case.arch, 0, seed=5)
    k_scale, v_scale = 0.02, 0.5  # far apart: a swap is 25x off
    sa.k_scale, sa.v_scale = k_scale, v_scale
    batch, x, cache = _pass(seed=6, cache_dtype=FP8)
    cos_sin = _cos_sin()
    got = sa.attend_heads(sa.qkv_proj(x), batch.positions, cos_sin, cache, batch.metadata)
    _, k, v = _heads(sa, x, case.gemma)
    k = _rotate(k, batch.positions, cos_sin)
    slots = batch.metadata.slot_mapping
    stored_k = cache[0].view(torch.uint8).reshape(-1, KV_HEADS, HEAD_DIM)[slots].view(FP8)
    stored_v = cache[1].view(torch.uint8).reshape(-1, KV_HEADS, HEAD_DIM)[slots].view(FP8)
    # One e4m3 rounding (3 mantissa bits) of k / k_scale and v / v_scale, saturated at 448.
    torch.testing.assert_close(stored_k.double(), (k / k_scale).clamp(-448, 448), rtol=0.07,
                               atol=2e-3)
    torch.testing.assert_close(stored_v.double(), (v / v_scale).clamp(-448, 448), rtol=0.07,
                               atol=2e-3)
    # Attention over the stored bytes times their own scales.
    read = (stored_k.double() * k_scale, stored_v.double() * v_scale)
    want = _reference(sa, x, cos_sin, case, 0, kv=read)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("family", ["qwen3", "bias", "gemma3"])
@torch.no_grad()
def test_permute_qk_dims_reorders_each_q_and_k_head_and_leaves_v(family):
    """After ``permute_qk_dims(perm)`` the layer's q and k heads (normed) are the old ones'
    dimensions in ``perm``'s order, v is unchanged, and with no rotation the attention output
    is the same."""
    case = CASES[family]
    sa = _layer(case.arch, 0, seed=7)
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(6, HIDDEN, generator=gen)
    perm = torch.randperm(HEAD_DIM, generator=gen)
    assert not torch.equal(perm, torch.arange(HEAD_DIM))
    q, k, v = _heads(sa, x, case.gemma)
    batch = make_batch([Chunk(list(range(6)), 0, [3, 8])])
    identity = _cos_sin(identity=True)
    cache = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    before = sa.attend_heads(sa.qkv_proj(x), batch.positions, identity, cache, batch.metadata)
    sa.permute_qk_dims(perm)
    q2, k2, v2 = _heads(sa, x, case.gemma)
    torch.testing.assert_close(q2, q[..., perm], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k2, k[..., perm], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(v2, v, atol=0, rtol=0)
    after = sa.attend_heads(sa.qkv_proj(x), batch.positions, identity, cache, batch.metadata)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
