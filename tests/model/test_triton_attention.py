"""The Triton attention backend against the torch reference backend on random paged batches.

On a GPU: bf16 and fp32, decode (split-K and not) and varlen prefill, GQA, odd lengths, block
boundaries, padding sequences, and decode inside a captured CUDA graph. Without a GPU, when
triton is installed, the same cases run in fp32 through Triton's interpreter in a subprocess
(``python tests/model/test_triton_attention.py`` with ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

if __name__ == "__main__":  # the interpreter driver: before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402
import torch  # noqa: E402

from cadence.model.attention import TorchAttentionBackend  # noqa: E402
from cadence.model.attention_metadata import AttentionMetadata  # noqa: E402
from tests.model.triton_interpreter import DONE, patch_interpreter, run_interpreted  # noqa: E402

DUMMY_BLOCK = 0  # never given to a sequence; padding tokens write its first slot
FP8 = torch.float8_e4m3fn
# Powers of two: a store's x * (1 / scale) and the reference's x / scale round alike.
FP8_SCALES = (0.5, 2.0)


@dataclass
class Case:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cache: torch.Tensor
    metadata: AttentionMetadata
    scale: float
    window: int = 0  # sliding window (0: none)
    softcap: float = 0.0  # score cap (0: none)
    k_scale: float = 1.0  # an FP8 cache's scales
    v_scale: float = 1.0


def make_case(
    seqs: list[tuple[int, int]],
    heads: int,
    kv_heads: int,
    head_dim: int,
    page: int,
    dtype: torch.dtype,
    device: str,
    num_padding: int = 0,
    padding_slot: int = DUMMY_BLOCK,
    seed: int = 0,
    num_blocks: int | None = None,
    width: int | None = None,
    window: int = 0,
    softcap: float = 0.0,
    kv_dtype: torch.dtype | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> Case:
    """``seqs`` = [(seq_len after this pass, query_len)]; ``num_padding`` padding sequences
    (seq_len 0, empty query range), each with one padding token at ``padding_slot``.
    Cache slots no sequence owns hold NaN, so any stray read shows in the output. ``kv_dtype``:
    the cache's dtype (default ``dtype``); an FP8 cache holds the context divided by
    ``kv_scales``."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // page) for s, _ in seqs]
    num_blocks = num_blocks or 1 + sum(blocks_per_seq) + 3
    order = (1 + torch.randperm(num_blocks - 1, generator=gen)).tolist()
    width = width or max(blocks_per_seq) + 1
    tables = torch.zeros(len(seqs) + num_padding, width, dtype=torch.int32)
    cache = torch.full((2, num_blocks, page, kv_heads, head_dim), float("nan"))
    slots: list[int] = []
    used = 0
    for i, ((seq_len, q_len), nb) in enumerate(zip(seqs, blocks_per_seq, strict=True)):
        row = order[used : used + nb]
        used += nb
        junk = torch.randint(0, num_blocks, (width - nb,), generator=gen).tolist()
        tables[i] = torch.tensor(row + junk, dtype=torch.int32)
        for pos in range(seq_len):
            block, off = row[pos // page], pos % page
            if pos < seq_len - q_len:  # context written by earlier passes
                kv = torch.randn(2, kv_heads, head_dim, generator=gen)
                cache[:, block, off] = kv / torch.tensor(kv_scales).view(2, 1, 1)
            else:
                slots.append(block * page + off)
    num_tokens = len(slots)
    slots += [padding_slot] * num_padding
    total = num_tokens + num_padding
    q = torch.randn(total, heads, head_dim, generator=gen)
    k = torch.randn(total, kv_heads, head_dim, generator=gen)
    v = torch.randn(total, kv_heads, head_dim, generator=gen)
    q_lens = [ql for _, ql in seqs] + [0] * num_padding
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor([s for s, _ in seqs] + [0] * num_padding, dtype=torch.int32)
    md = AttentionMetadata(
        num_actual_tokens=num_tokens,
        max_query_len=max(q_lens),
        max_seq_len=int(seq_lens.max()),
        query_start_loc=starts.to(device),
        seq_lens=seq_lens.to(device),
        block_tables=tables.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64).to(device),
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
    )
    return Case(
        q.to(device, dtype), k.to(device, dtype), v.to(device, dtype),
        cache.to(device, kv_dtype or dtype), md, head_dim**-0.5, window, softcap, *kv_scales,
    )  # fmt: skip


def pad_like_a_graph(case: Case, extra_tokens: int, empty_rows: int) -> Case:
    """The case as a mixed-step CUDA graph sees it: ``extra_tokens`` padding tokens that belong
    to no sequence (slot -1) and ``empty_rows`` sequences with an empty query range."""
    md = case.metadata
    dev = case.q.device
    n = case.q.shape[0]

    def grow(x: torch.Tensor) -> torch.Tensor:
        junk = torch.randn(extra_tokens, *x.shape[1:], dtype=torch.float32).to(dev, x.dtype)
        return torch.cat([x, junk])

    qsl = md.query_start_loc.cpu()
    qsl = torch.cat([qsl, torch.full((empty_rows,), int(qsl[-1]), dtype=torch.int32)])
    seq_lens = torch.cat([md.seq_lens.cpu(), torch.zeros(empty_rows, dtype=torch.int32)])
    tables = md.block_tables.cpu()
    tables = torch.cat([tables, torch.zeros(empty_rows, tables.shape[1], dtype=torch.int32)])
    slots = torch.cat([md.slot_mapping.cpu(), torch.full((extra_tokens,), -1)])
    padded = AttentionMetadata(
        num_actual_tokens=md.num_actual_tokens,
        max_query_len=n + extra_tokens,  # as a graph is captured: no host length is trusted
        max_seq_len=md.max_seq_len,
        query_start_loc=qsl.to(dev),
        seq_lens=seq_lens.to(dev),
        block_tables=tables.to(dev),
        slot_mapping=slots.to(dev),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
    )
    return Case(
        grow(case.q), grow(case.k), grow(case.v), case.cache, padded, case.scale, case.window,
        case.softcap, case.k_scale, case.v_scale,
    )  # fmt: skip


def reference(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    cache = case.cache.clone()
    out = TorchAttentionBackend().forward(
        case.q, case.k, case.v, cache, case.metadata, case.scale, case.window, case.softcap,
        case.k_scale, case.v_scale,
    )
    return out, cache


def _bits(cache: torch.Tensor) -> torch.Tensor:
    return cache.view(torch.uint8) if cache.dtype == FP8 else cache


def assert_matches(case: Case, out: torch.Tensor, cache: torch.Tensor) -> None:
    want, want_cache = reference(case)
    n = case.metadata.num_actual_tokens
    got, ref = out[:n].double(), want[:n].double()
    assert torch.isfinite(got).all()
    rel = float((got - ref).norm() / ref.norm())
    tol = 1e-5 if case.q.dtype == torch.float32 else 1e-2
    assert rel < tol, f"relative error {rel:.2e}"
    atol = 1e-4 if case.q.dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, ref, atol=atol, rtol=atol)
    # Identical stores everywhere but the dummy block (several padding tokens race there).
    torch.testing.assert_close(_bits(cache[:, 1:]), _bits(want_cache[:, 1:]), equal_nan=True,
                               atol=0, rtol=0)


DECODE_SEQS = [(1, 1), (15, 1), (16, 1), (17, 1), (64, 1), (200, 1), (333, 1)]
PREFILL_SEQS = [(1, 1), (17, 17), (40, 7), (16, 16), (33, 1), (130, 70), (65, 64)]
# Decode rows among chunks and whole prompts, as a mixed step of a running server has them.
MIXED_SEQS = [(90, 1), (300, 1), (64, 64), (31, 1), (200, 100), (7, 7), (129, 1), (48, 33)]


def run_decode(device: str, dtype: torch.dtype, page: int, splits: int | None, fused: bool,
               window: int = 0, softcap: float = 0.0, fp8: bool = False,
               tile: tuple | None = None) -> None:
    from cadence.model.attention_tiles import DecodeConfig
    from cadence.model.triton_attention import paged_decode_attention, store_kv_cache

    case = make_case(DECODE_SEQS, 8, 2, 64, page, dtype, device, num_padding=3, window=window,
                     softcap=softcap, kv_dtype=FP8 if fp8 else None,
                     kv_scales=FP8_SCALES if fp8 else (1.0, 1.0))
    cache = case.cache.clone()
    out = torch.full_like(case.q, float("nan"))  # every real row must be written
    md = case.metadata
    scales = {"k_scale": case.k_scale, "v_scale": case.v_scale}
    config = None if tile is None else DecodeConfig(*tile)
    if fused:
        paged_decode_attention(
            case.q, cache, md, case.scale, out, 132, splits, case.k, case.v,
            sliding_window=window, softcap=softcap, config=config, **scales,
        )  # fmt: skip
    else:
        store_kv_cache(case.k, case.v, cache, md.slot_mapping, case.k_scale, case.v_scale)
        paged_decode_attention(case.q, cache, md, case.scale, out, 132, splits,
                               sliding_window=window, softcap=softcap, config=config, **scales)
    assert_matches(case, out, cache)


def run_decode_rope(device: str, dtype: torch.dtype, norm: bool, splits: int | None,
                    page: int = 16, early: bool = False) -> None:
    """The decode kernel with the q/k norms and RoPE in its loads against qk_norm_rope's
    reference followed by the reference attention: outputs and the stored keys."""
    from cadence.model.attention_metadata import QKRope
    from cadence.model.attention_tiles import DecodeConfig, decode_config
    from cadence.model.fused_ops import qk_norm_rope_reference
    from cadence.model.triton_attention import paged_decode_attention, rope_fusable

    case = make_case(DECODE_SEQS, 8, 2, 64, page, dtype, device, num_padding=3, seed=3)
    gen = torch.Generator().manual_seed(4)
    md = case.metadata
    positions = (md.seq_lens.cpu().long() - 1).clamp(min=0).to(device)  # one token per sequence
    table = torch.randn(400, 64, generator=gen).to(device, dtype)
    qw, kw = (torch.rand(64, generator=gen).add(0.5).to(device, dtype) for _ in range(2))
    rope = QKRope(positions, table, qw if norm else None, kw if norm else None, 1e-6)
    q_ref, k_ref = qk_norm_rope_reference(case.q, case.k, positions, table, rope.q_weight,
                                          rope.k_weight, rope.eps)
    rotated = Case(q_ref, k_ref, case.v, case.cache, md, case.scale)
    want, want_cache = reference(rotated)
    assert rope_fusable(case.q, case.k, rope)
    cache = case.cache.clone()
    out = torch.full_like(case.q, float("nan"))
    config = DecodeConfig(decode_config(dtype == torch.float32).block_n, early=True) if early \
        else None
    paged_decode_attention(case.q, cache, md, case.scale, out, 132, splits, case.k, case.v,
                           rope=rope, config=config)
    n = md.num_actual_tokens
    got, ref = out[:n].double(), want[:n].double()
    # bf16: q and k may differ from the reference's by one rounding of the norm (its sum runs
    # in another order), which a score near a tie can amplify in a rare output element.
    fp32 = dtype == torch.float32
    assert float((got - ref).norm() / ref.norm()) < (1e-5 if fp32 else 1e-2)
    tol = 1e-5 if fp32 else 6e-2
    torch.testing.assert_close(got, ref, atol=tol, rtol=tol)
    # The stored keys: qk_norm_rope's, up to that rounding (one ulp of bf16: 2 ** -8 relative).
    tol = 1e-5 if fp32 else 8e-3
    torch.testing.assert_close(cache[:, 1:].double(), want_cache[:, 1:].double(), equal_nan=True,
                               atol=tol, rtol=tol)


def run_varlen_rope(device: str, dtype: torch.dtype, norm: bool, fp8: bool = False) -> None:
    """A varlen step with the q/k norms and RoPE: the rope launch that also stores K/V gives
    the same q, k and cache bytes as the rope launch followed by store_kv_cache (it refuses an
    FP8 cache, which the backend stores on its own), and the backend's output and cache match
    the reference on the rotated q and k."""
    from cadence.model.attention_metadata import QKRope
    from cadence.model.fused_ops import KVStore, qk_norm_rope_triton
    from cadence.model.triton_attention import store_kv_cache
    from cadence.model.triton_backend import TritonAttentionBackend

    scales = FP8_SCALES if fp8 else (1.0, 1.0)
    case = make_case(MIXED_SEQS, 8, 2, 64, 16, dtype, device, num_padding=3, padding_slot=-1,
                     seed=6, kv_dtype=FP8 if fp8 else None, kv_scales=scales)
    md = case.metadata
    # q, k and v as the attention layer passes them: views of one fused qkv projection.
    t = case.q.shape[0]
    qkv = torch.cat([case.q.reshape(t, -1), case.k.reshape(t, -1), case.v.reshape(t, -1)], 1)
    q, k, v = qkv.split([case.q[0].numel(), case.k[0].numel(), case.v[0].numel()], dim=1)
    case.q, case.k, case.v = q.view(case.q.shape), k.view(case.k.shape), v.view(case.v.shape)
    gen = torch.Generator().manual_seed(7)
    positions = torch.randint(0, 400, (case.q.shape[0],), generator=gen).to(device)
    table = torch.randn(400, 64, generator=gen).to(device, dtype)
    qw, kw = (torch.rand(64, generator=gen).add(0.5).to(device, dtype) for _ in range(2))
    rope = QKRope(positions, table, qw if norm else None, kw if norm else None, 1e-6)
    args = (case.q, case.k, positions, table, rope.q_weight, rope.k_weight, rope.eps)
    q1, k1 = qk_norm_rope_triton(*args)
    split = case.cache.clone()
    store_kv_cache(k1, case.v, split, md.slot_mapping, *scales)
    fused = case.cache.clone()

    def same(a: torch.Tensor, b: torch.Tensor) -> None:  # unwritten slots hold NaN
        # Padding tokens have slot -1: nothing may land in any block, the dummy one included.
        torch.testing.assert_close(_bits(a), _bits(b), equal_nan=True, atol=0, rtol=0)

    if fp8:
        with pytest.raises(ValueError, match="float8"):
            qk_norm_rope_triton(*args, KVStore(case.v, fused, md.slot_mapping))
    else:
        q2, k2 = qk_norm_rope_triton(*args, KVStore(case.v, fused, md.slot_mapping))
        assert torch.equal(q1, q2) and torch.equal(k1, k2)
        same(fused, split)
    cache = case.cache.clone()
    out = TritonAttentionBackend(num_sms=3).forward(
        case.q, case.k, case.v, cache, md, case.scale, k_scale=scales[0], v_scale=scales[1],
        rope=rope)
    same(cache, split)
    if device == "cuda":  # rope.apply runs the same kernel there (the CPU's is the reference)
        unfused = case.cache.clone()
        out2 = TritonAttentionBackend(fuse_rope=False, num_sms=3).forward(
            case.q, case.k, case.v, unfused, md, case.scale, k_scale=scales[0],
            v_scale=scales[1], rope=rope)
        same(unfused, split)
        assert torch.equal(out2[: md.num_actual_tokens], out[: md.num_actual_tokens])
    rotated = Case(q1, k1, case.v, case.cache, md, case.scale, k_scale=scales[0],
                   v_scale=scales[1])
    assert_matches(rotated, out, cache)


def run_prefill(device: str, dtype: torch.dtype, heads: int, kv_heads: int, dim: int,
                window: int = 0, softcap: float = 0.0, fp8: bool = False,
                num_sms: int | None = None) -> None:
    """``num_sms`` pins the varlen grid's size: with few SMs each program walks several query
    blocks of several sequences."""
    from cadence.model.triton_backend import TritonAttentionBackend

    case = make_case(PREFILL_SEQS, heads, kv_heads, dim, 16, dtype, device, 1, padding_slot=-1,
                     window=window, softcap=softcap, kv_dtype=FP8 if fp8 else None,
                     kv_scales=FP8_SCALES if fp8 else (1.0, 1.0))
    cache = case.cache.clone()
    out = TritonAttentionBackend(num_sms=num_sms).forward(
        case.q, case.k, case.v, cache, case.metadata, case.scale, window, softcap,
        case.k_scale, case.v_scale,
    )
    assert_matches(case, out, cache)


def run_mixed_padded(device: str, dtype: torch.dtype, heads: int, kv_heads: int, dim: int,
                     extra_tokens: int, empty_rows: int, window: int = 0,
                     softcap: float = 0.0, num_sms: int | None = None) -> None:
    from cadence.model.triton_backend import TritonAttentionBackend

    case = make_case(MIXED_SEQS, heads, kv_heads, dim, 16, dtype, device, seed=3, window=window,
                     softcap=softcap)
    padded = pad_like_a_graph(case, extra_tokens, empty_rows)
    cache = case.cache.clone()
    out = TritonAttentionBackend(num_sms=num_sms).forward(
        padded.q, padded.k, padded.v, cache, padded.metadata, padded.scale, window, softcap
    )
    assert_matches(case, out[: case.q.shape[0]], cache)


def run_walk(device: str, dtype: torch.dtype, programs: int, empty_rows: int,
             window: int = 0) -> None:
    """The varlen kernel with ``programs`` programs per kv head, each walking many query blocks
    of many sequences; with more than 256 rows (``empty_rows`` padding) the kernel reads its
    sequence table again per block instead of holding it."""
    from cadence.model.triton_attention import paged_varlen_attention, store_kv_cache

    case = make_case(MIXED_SEQS, 8, 2, 32, 16, dtype, device, seed=5, window=window)
    padded = pad_like_a_graph(case, 11, empty_rows)
    cache = case.cache.clone()
    store_kv_cache(padded.k, padded.v, cache, padded.metadata.slot_mapping)
    out = torch.full_like(padded.q, float("nan"))
    paged_varlen_attention(padded.q, cache, padded.metadata, padded.scale, out,
                           sliding_window=window, programs=programs)
    assert_matches(case, out[: case.q.shape[0]], cache)


def run_fp8_reads(device: str, dtype: torch.dtype, window: int = 0, softcap: float = 0.0) -> None:
    """Decode (split and not) and varlen reads of an FP8 cache that the reference backend
    stored, against the reference's outputs, with the kernels' stores left out."""
    from cadence.model.attention import write_kv_cache
    from cadence.model.triton_attention import paged_decode_attention, paged_varlen_attention

    for seqs, decode in ((DECODE_SEQS, True), (MIXED_SEQS, False)):
        case = make_case(seqs, 8, 2, 32, 16, dtype, device, num_padding=2, padding_slot=-1,
                         window=window, softcap=softcap, kv_dtype=FP8, kv_scales=FP8_SCALES)
        want, stored = reference(case)
        cache = case.cache.clone()
        write_kv_cache(case.k, case.v, cache, case.metadata.slot_mapping, *FP8_SCALES)
        assert torch.equal(_bits(cache), _bits(stored))
        for splits in ((1, 4) if decode else (None,)):
            out = torch.full_like(case.q, float("nan"))
            if decode:
                paged_decode_attention(case.q, cache, case.metadata, case.scale, out, 132, splits,
                                       sliding_window=window, softcap=softcap, k_scale=0.5,
                                       v_scale=2.0)
            else:
                paged_varlen_attention(case.q, cache, case.metadata, case.scale, out,
                                       sliding_window=window, softcap=softcap, k_scale=0.5,
                                       v_scale=2.0)
            n = case.metadata.num_actual_tokens
            got, ref = out[:n].double(), want[:n].double()
            rel = float((got - ref).norm() / ref.norm())
            assert rel < (1e-5 if dtype == torch.float32 else 1e-2), f"relative error {rel:.2e}"


# Values to store into an e4m3 cache and what the cache must then hold: e4m3 has 3 mantissa bits
# (normal ulp 2 ** (e - 3) for |x| in [2 ** e, 2 ** (e + 1)), subnormal ulp 2 ** -9 below 2 ** -6)
# and 448 as its largest finite value; stores round to nearest even and saturate.
E4M3_STORES = [
    (1.97, 2.0), (-7.9, -8.0), (0.49, 0.5), (3.9, 4.0), (250.0, 256.0),  # up past a power of 2
    (1.0625, 1.0), (1.1875, 1.25), (30.5, 30.0), (0.3, 0.3125),  # ties to even; nearest
    (0.0127843, 7 * 2.0**-9), (1.5 * 2.0**-10, 2.0**-9), (5 * 2.0**-10, 2 * 2.0**-9),  # subnormal
    (-(2.0**-10), -0.0), (1000.0, 448.0), (-500.0, -448.0), (460.0, 448.0),  # saturation
]


def run_fp8_store_rounding(device: str, dtype: torch.dtype) -> None:
    """Every store into an FP8 cache (the store launch, the decode kernel's, the early decode
    kernel's) and the reference's write round to the nearest e4m3 (ties to even) and saturate
    to +-448: the cache holds ``E4M3_STORES``' expected values, scales applied."""
    from cadence.model.attention import write_kv_cache
    from cadence.model.attention_tiles import DecodeConfig
    from cadence.model.triton_attention import paged_decode_attention, store_kv_cache

    values = torch.tensor([x for x, _ in E4M3_STORES])
    want = torch.tensor([y for _, y in E4M3_STORES])
    k_scale, v_scale = 1.0, 0.5  # v / 0.5: the values are stored as 2 * v
    case = make_case([(3, 1)], 2, 1, len(E4M3_STORES), 16, dtype, device, kv_dtype=FP8,
                     kv_scales=(k_scale, v_scale))
    case.k = values.view(1, 1, -1).to(device, dtype)
    case.v = (values * v_scale).view(1, 1, -1).to(device, dtype)
    slot = int(case.metadata.slot_mapping[0])
    stores = {
        "reference": lambda c: write_kv_cache(case.k, case.v, c, case.metadata.slot_mapping,
                                              k_scale, v_scale),
        "store launch": lambda c: store_kv_cache(case.k, case.v, c, case.metadata.slot_mapping,
                                                 k_scale, v_scale),
    }
    for early in (False, True):
        def decode(c: torch.Tensor, early: bool = early) -> None:
            paged_decode_attention(case.q, c, case.metadata, case.scale, torch.empty_like(case.q),
                                   132, 1, case.k, case.v, k_scale=k_scale, v_scale=v_scale,
                                   config=DecodeConfig(16, early=early))
        stores["early decode" if early else "decode"] = decode
    for name, store in stores.items():
        cache = case.cache.clone()
        store(cache)
        got = cache.view(2, -1, len(E4M3_STORES))[:, slot].float().cpu()
        for which, stored in zip(("keys", "values"), got, strict=True):
            assert torch.equal(stored, want), (name, which, stored.tolist())
            # -0.0 stays negative
            assert torch.equal(stored.signbit(), want.signbit()), (name, which, stored.tolist())


def _strided(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values in a tensor whose last dimension is not contiguous."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def run_host_arguments(device: str, dtype: torch.dtype) -> None:
    """What the launches take from their host arguments: a 16/32-bit cache ignores k_scale and
    v_scale (a checkpoint's FP8 scales, loaded whatever the cache's dtype); keys and values whose
    last dimension is not contiguous are stored as their values; a decode launch given the early
    load order but no k and v stores nothing."""
    from cadence.model.attention_tiles import DecodeConfig
    from cadence.model.triton_attention import (
        paged_decode_attention,
        paged_varlen_attention,
        store_kv_cache,
    )

    scales = {"k_scale": 4.0, "v_scale": 0.25}
    case = make_case([(5, 1), (20, 1), (9, 1)], 4, 2, 16, 8, dtype, device, num_padding=1)
    md = case.metadata
    assert case.k.stride(-1) == 1 and _strided(case.k).stride(-1) != 1
    for splits in (1, 3):
        cache = case.cache.clone()
        out = torch.full_like(case.q, float("nan"))
        paged_decode_attention(case.q, cache, md, case.scale, out, 132, splits,
                               _strided(case.k), _strided(case.v), **scales)
        assert_matches(case, out, cache)
        for config in (None, DecodeConfig(16, early=True)):  # reads only
            cache = case.cache.clone()
            store_kv_cache(case.k, case.v, cache, md.slot_mapping)
            out = torch.full_like(case.q, float("nan"))
            paged_decode_attention(case.q, cache, md, case.scale, out, 132, splits,
                                   config=config, **scales)
            assert_matches(case, out, cache)
    case = make_case([(9, 4), (3, 3), (20, 20)], 4, 2, 16, 8, dtype, device, num_padding=1,
                     padding_slot=-1, seed=2)
    cache = case.cache.clone()
    store_kv_cache(_strided(case.k), _strided(case.v), cache, case.metadata.slot_mapping,
                   **scales)
    out = torch.full_like(case.q, float("nan"))
    paged_varlen_attention(case.q, cache, case.metadata, case.scale, out, **scales)
    assert_matches(case, out, cache)


# ---- CPU: Triton's interpreter, in a subprocess (the interpreter mode is process-wide) ----

# The interpreted cases in parts, a subprocess each, so that each stays well inside its limit.
INTERPRETED_PARTS = ("decode_caps", "prefill_windows", "fp8_rows", "host_args")


def run_rows(device: str, dtype: torch.dtype, window: int = 0, softcap: float = 0.0,
             fp8: bool = False, fuse_rope: bool = True, fresh: bool = False) -> None:
    """``forward_rows`` against ``forward``: the same cache bytes (every token stored), and at
    each sequence's last token the whole pass's output, within the decode kernel's rounding
    against the varlen kernel's (or cuDNN's, for a lone ``fresh`` prompt)."""
    from cadence.model.attention_metadata import OutputRows, QKRope
    from cadence.model.triton_backend import TritonAttentionBackend

    scales = FP8_SCALES if fp8 else (1.0, 1.0)
    seqs = [(800, 800)] if fresh else MIXED_SEQS
    case = make_case(seqs, 8, 2, 64, 16, dtype, device, seed=9, window=window, softcap=softcap,
                     kv_dtype=FP8 if fp8 else None, kv_scales=scales)
    if not fresh:
        case = pad_like_a_graph(case, extra_tokens=5, empty_rows=2)
    md = replace(case.metadata, fresh_prompt=fresh)
    n = len(seqs)
    index = (md.query_start_loc[1 : n + 1] - 1).to(torch.int32)
    starts = torch.arange(n + 1, dtype=torch.int32)
    rows = OutputRows(index, replace(md, num_actual_tokens=n, max_query_len=1,
                                     query_start_loc=starts.to(device), seq_lens=md.seq_lens[:n],
                                     block_tables=md.block_tables[:n], fresh_prompt=False,
                                     query_start_loc_cpu=starts, seq_lens_cpu=md.seq_lens_cpu[:n]))
    gen = torch.Generator().manual_seed(10)
    positions = torch.randint(0, 900, (case.q.shape[0],), generator=gen).to(device)
    table = torch.randn(900, 64, generator=gen).to(device, dtype)
    qw, kw = (torch.rand(64, generator=gen).add(0.5).to(device, dtype) for _ in range(2))
    rope = QKRope(positions, table, qw, kw, 1e-6)
    backend = TritonAttentionBackend(fuse_rope=fuse_rope, num_sms=3)
    args = (case.scale, window, softcap, *scales, rope)
    whole_cache, rows_cache = case.cache.clone(), case.cache.clone()
    whole = backend.forward(case.q, case.k, case.v, whole_cache, md, *args)
    got = backend.forward_rows(case.q, case.k, case.v, rows_cache, md, rows, *args)
    torch.testing.assert_close(_bits(rows_cache), _bits(whole_cache), equal_nan=True, atol=0,
                               rtol=0)
    assert got.shape == (n, *case.q.shape[1:])
    want = whole[index.long()].double()
    fp32 = dtype == torch.float32
    assert float((got.double() - want).norm() / want.norm()) < (1e-5 if fp32 else 1e-2)
    tol = 1e-4 if fp32 else 3e-2
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


@pytest.mark.timeout(600)  # the interpreter's subprocess, minutes on 2 cores
@pytest.mark.parametrize("part", INTERPRETED_PARTS)
def test_kernels_in_triton_interpreter(part: str) -> None:
    run_interpreted(__file__, args=(part,))


def test_varlen_programs_cover_every_block_with_few_idle_programs() -> None:
    """The varlen grid: a program per possible query block without an SM count; with one,
    about two programs per SM over the kv heads, never fewer than one long prompt's blocks,
    never more than the blocks a bucket can hold (padding rows add none past that)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from cadence.model.attention_tiles import varlen_programs

    assert varlen_programs(1024, 64, 256, 8, None) == 1024 // 64 + 256
    # A 1024-token bucket of 256 rows: 33 programs per kv head (264 on 132 SMs), not 272.
    assert varlen_programs(1024, 64, 256, 8, 132) == 33
    assert varlen_programs(4096, 64, 8, 8, 132) == 4096 // 64 + 1  # one per block of a prompt
    assert varlen_programs(16, 16, 1, 8, 132) == 2  # the bound: one 16-token sequence
    assert varlen_programs(48, 64, 3, 2, 132) == 3
    for tokens, block_q, seqs, heads in ((1, 1, 1, 1), (7, 4, 7, 3), (2048, 32, 512, 4)):
        p = varlen_programs(tokens, block_q, seqs, heads, 132)
        assert 1 <= p <= tokens // block_q + seqs


def test_split_choice_depends_on_shapes_only() -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from cadence.model.attention_tiles import choose_num_splits

    assert choose_num_splits(1, 8, 4096, 132) == 64
    assert choose_num_splits(1, 8, 256, 132) == 4
    assert choose_num_splits(1, 8, 64, 132) == 1
    assert choose_num_splits(32, 8, 4096, 132) == 2
    assert choose_num_splits(33, 8, 4096, 132) == 1
    assert choose_num_splits(4, 8, 4096, 132) == 16
    for b in range(1, 40):
        s = choose_num_splits(b, 2, 8192, 132)
        assert s & (s - 1) == 0 and 1 <= s <= 64


def test_launches_check_the_cache_and_the_rope() -> None:
    """A cache whose last dimension is not contiguous is refused; ``rope_fusable`` holds only
    for the arithmetic the decode kernel does (an even head size, a contiguous table of that
    width and positions, q's dtype throughout, contiguous weights of one head's size), and rope
    in a decode launch needs its new k and v."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from cadence.model.attention_metadata import QKRope
    from cadence.model.triton_attention import (
        paged_decode_attention,
        rope_fusable,
        store_kv_cache,
    )

    case = make_case([(5, 1), (9, 1)], 4, 2, 16, 8, torch.float32, "cpu")
    md = case.metadata
    strided = torch.zeros(2, case.cache.shape[1], 8, 2, 32)[..., ::2]
    assert strided.shape == case.cache.shape
    with pytest.raises(ValueError, match="contiguous last dimension"):
        store_kv_cache(case.k, case.v, strided, md.slot_mapping)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        paged_decode_attention(case.q, strided, md, case.scale, torch.empty_like(case.q), 132)

    q, k = case.q, case.k
    gen = torch.Generator().manual_seed(0)
    positions = torch.tensor([4, 8])
    table = torch.randn(16, 16, generator=gen)
    w = torch.rand(16, generator=gen) + 0.5
    assert rope_fusable(q, k, QKRope(positions, table, w, w, 1e-6))
    assert rope_fusable(q, k, QKRope(positions, table))
    odd = torch.randn(2, 4, 15, generator=gen)
    refused = {
        "odd head size": (odd, odd[:, :2].contiguous(), QKRope(positions, table[:, :15])),
        "table width": (q, k, QKRope(positions, torch.randn(16, 32, generator=gen))),
        "strided table": (q, k, QKRope(positions, torch.randn(16, 32, generator=gen)[:, ::2])),
        "strided positions": (q, k, QKRope(torch.tensor([4, 0, 8, 0])[::2], table)),
        "table dtype": (q, k, QKRope(positions, table.to(torch.bfloat16))),
        "k dtype": (q, k.to(torch.bfloat16), QKRope(positions, table)),
        "weight dtype": (q, k, QKRope(positions, table, w, w.to(torch.bfloat16), 1e-6)),
        "weight size": (q, k, QKRope(positions, table, torch.rand(32), w, 1e-6)),
        "strided weight": (q, k, QKRope(positions, table, w, torch.rand(32)[::2], 1e-6)),
    }
    for name, (q_, k_, rope) in refused.items():
        assert not rope_fusable(q_, k_, rope), name
    with pytest.raises(ValueError, match="rope"):
        paged_decode_attention(q, case.cache.clone(), md, case.scale, torch.empty_like(q), 132,
                               rope=QKRope(positions, table))


def test_split_count_sees_the_context_a_query_can_reach(monkeypatch) -> None:
    """Without a split count given, decode splits by the shapes: the sequences, kv heads, the
    SMs, the tile's keys and the longest context (the block table's width in tokens, or the
    window when shorter)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from cadence.model import triton_attention
    from cadence.model.attention_tiles import DecodeConfig

    class Chosen(Exception):
        pass

    def choose(*args: int) -> int:
        raise Chosen(args)

    monkeypatch.setattr(triton_attention, "choose_num_splits", choose)
    case = make_case([(5, 1), (9, 1), (30, 1)], 4, 2, 16, 8, torch.float32, "cpu", width=40)
    out = torch.empty_like(case.q)
    for window, context in ((0, 320), (37, 37), (500, 320)):
        with pytest.raises(Chosen) as chosen:
            triton_attention.paged_decode_attention(
                case.q, case.cache, case.metadata, case.scale, out, 132, sliding_window=window,
                config=DecodeConfig(16))
        assert chosen.value.args[0] == (3, 2, context, 132, 16)


def test_decode_config_checks_its_tile() -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from cadence.model.attention_tiles import DecodeConfig, decode_config

    assert decode_config(True) == DecodeConfig(32, 4, 2)
    assert decode_config(False) == DecodeConfig(64, 4, 2)
    # The early load order: 16-bit caches under programmatic dependent launches, for one
    # sequence, or for 1-8 after a qkv projection that releases early.
    assert decode_config(False, 1, True) == DecodeConfig(64, 4, 2, early=True)
    for fp32, seqs, pdl in ((False, 2, True), (False, 1, False), (True, 1, True)):
        assert not decode_config(fp32, seqs, pdl).early
    for seqs in (1, 2, 5, 8):
        assert decode_config(False, seqs, True, True) == DecodeConfig(64, 4, 2, early=True)
    for fp32, seqs, pdl in ((False, 9, True), (False, 64, True), (False, 8, False),
                            (True, 8, True), (False, 0, True)):
        assert not decode_config(fp32, seqs, pdl, True).early
    for bad in ((48, 4, 2), (8, 4, 2), (64, 3, 2), (64, 4, 0)):
        with pytest.raises(ValueError):
            DecodeConfig(*bad)


# ---- GPU ----


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "page"), [(torch.float32, 16), (torch.bfloat16, 32)])
@pytest.mark.parametrize(("splits", "fused"), [(None, True), (1, False), (1, True), (3, True)])
def test_decode_matches_reference(
    dtype: torch.dtype, page: int, splits: int | None, fused: bool
) -> None:
    run_decode("cuda", dtype, page, splits, fused)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [(32, 2, 1), (64, 8, 1), (128, 8, 2), (64, 4, 2, True),
                                  (32, 2, 1, True)])
@pytest.mark.parametrize("splits", [None, 1])
def test_decode_tiles_match_reference(tile: tuple, splits: int | None) -> None:
    run_decode("cuda", torch.bfloat16, 16, splits, True, tile=tile)
    if len(tile) == 4:  # the early load order with windows, caps and an FP8 cache too
        run_decode("cuda", torch.bfloat16, 16, splits, True, 37, 0.5, tile=tile)
        run_decode("cuda", torch.bfloat16, 16, splits, True, fp8=True, tile=tile)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("norm", "splits"), [(True, None), (False, None), (True, 1)])
def test_decode_with_qk_norm_rope_matches_reference(dtype: torch.dtype, norm: bool,
                                                    splits: int | None) -> None:
    run_decode_rope("cuda", dtype, norm, splits)
    run_decode_rope("cuda", dtype, norm, splits, early=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(16, 8, 128), (4, 4, 80)])
def test_prefill_matches_reference(dtype: torch.dtype, heads: int, kv_heads: int, dim: int) -> None:
    run_prefill("cuda", dtype, heads, kv_heads, dim)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(16, 8, 128), (32, 8, 128), (4, 4, 80)])
def test_mixed_padded_matches_reference(
    dtype: torch.dtype, heads: int, kv_heads: int, dim: int
) -> None:
    run_mixed_padded("cuda", dtype, heads, kv_heads, dim, extra_tokens=37, empty_rows=9)
    for sms in (1, 5):  # few programs, each walking several query blocks
        run_mixed_padded("cuda", dtype, heads, kv_heads, dim, 37, 9, num_sms=sms)
        run_prefill("cuda", dtype, heads, kv_heads, dim, num_sms=sms)
    for programs, empty_rows in ((1, 3), (2, 9), (3, 300), (7, 1100)):
        run_walk("cuda", dtype, programs, empty_rows)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fp8", [False, True])
def test_varlen_rope_stores_the_cache(dtype: torch.dtype, fp8: bool) -> None:
    for norm in (True, False):
        run_varlen_rope("cuda", dtype, norm, fp8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [5, 37, 100, 4096])
def test_sliding_window_matches_reference(dtype: torch.dtype, window: int) -> None:
    run_decode("cuda", dtype, 16, None, True, window)
    run_decode("cuda", dtype, 16, 3, True, window)
    run_prefill("cuda", dtype, 16, 8, 128, window)
    run_mixed_padded("cuda", dtype, 32, 8, 128, 37, 9, window)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("window", "cap"), [(0, 0.5), (0, 50.0), (100, 0.5)])
def test_softcap_matches_reference(dtype: torch.dtype, window: int, cap: float) -> None:
    run_decode("cuda", dtype, 16, None, True, window, cap)
    run_prefill("cuda", dtype, 16, 8, 256, window, cap)
    run_mixed_padded("cuda", dtype, 8, 4, 256, 37, 9, window, cap)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("window", "cap"), [(0, 0.0), (37, 0.0), (0, 0.5)])
def test_fp8_cache_matches_reference(dtype: torch.dtype, window: int, cap: float) -> None:
    """Stores (fused into decode, and the separate store) byte for byte, and every read."""
    for splits, fused in ((None, True), (1, False), (4, True)):
        run_decode("cuda", dtype, 16, splits, fused, window, cap, fp8=True)
    run_prefill("cuda", dtype, 8, 2, 128, window, cap, fp8=True)
    run_fp8_reads("cuda", dtype, window, cap)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_stores_round_to_nearest_even_and_saturate(dtype: torch.dtype) -> None:
    run_fp8_store_rounding("cuda", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("window", "cap", "fp8", "fuse"), [
    (0, 0.0, False, True), (37, 0.0, False, True), (0, 0.5, False, True), (0, 0.0, True, True),
    (0, 0.0, False, False)])
def test_rows_match_the_whole_pass(dtype: torch.dtype, window: int, cap: float, fp8: bool,
                                   fuse: bool) -> None:
    run_rows("cuda", dtype, window, cap, fp8, fuse)


@pytest.mark.gpu
def test_rows_of_a_fresh_prompt_match_dense_attention() -> None:
    run_rows("cuda", torch.bfloat16, fresh=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_host_arguments(dtype: torch.dtype) -> None:
    run_host_arguments("cuda", dtype)


@pytest.mark.gpu
def test_qwen3_decode_shapes_bf16() -> None:
    from cadence.model.triton_backend import TritonAttentionBackend

    gen = torch.Generator().manual_seed(5)
    seqs = [(int(n), 1) for n in torch.randint(1, 1500, (33,), generator=gen)]
    case = make_case(seqs, 16, 8, 128, 16, torch.bfloat16, "cuda", num_padding=2, seed=5)
    cache = case.cache.clone()
    out = TritonAttentionBackend().forward(case.q, case.k, case.v, cache, case.metadata, case.scale)
    assert_matches(case, out, cache)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seqs", [[(20, 1), (47, 1), (16, 1)], [(47, 1)]])
def test_decode_replays_inside_a_cuda_graph(dtype: torch.dtype, seqs: list) -> None:
    """Three sequences and a padding row; one sequence alone (bf16: the early load order)."""
    from cadence.model.triton_backend import TritonAttentionBackend

    backend = TritonAttentionBackend()
    padding = 1 if len(seqs) > 1 else 0
    shape = {"num_blocks": 24, "width": 16}  # 256-token tables: split-K in the graph
    static = make_case(seqs, 8, 2, 64, 16, dtype, "cuda", padding, seed=1, **shape)
    cache = static.cache.clone()
    md = static.metadata
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        backend.forward(static.q, static.k, static.v, cache.clone(), md, static.scale)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = backend.forward(static.q, static.k, static.v, cache, md, static.scale)
    for step in range(3):
        grown = [(s + step * 9, 1) for s, _ in seqs]  # longer contexts than at capture
        case = make_case(grown, 8, 2, 64, 16, dtype, "cuda", padding, seed=10 + step, **shape)
        # Same shapes: copy the new step into the captured buffers, then replay.
        for name in ("q", "k", "v", "cache"):
            getattr(static, name).copy_(getattr(case, name))
        cache.copy_(case.cache)
        for name in ("seq_lens", "block_tables", "slot_mapping", "query_start_loc"):
            getattr(md, name).copy_(getattr(case.metadata, name))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(case, out, cache)


if __name__ == "__main__":
    patch_interpreter()
    parts = sys.argv[1:] or list(INTERPRETED_PARTS)
    if not set(parts) <= set(INTERPRETED_PARTS):
        raise SystemExit(f"unknown part(s) {parts}; the parts are {INTERPRETED_PARTS}")
    if "decode_caps" in parts:
        run_decode("cpu", torch.float32, 16, None, True)
        run_decode("cpu", torch.float32, 16, 1, False)
        run_decode("cpu", torch.float32, 16, 1, True)
        run_decode("cpu", torch.float32, 8, 3, True)
        # Other tiles (keys per step, warps, stages) than the default, split and not.
        run_decode("cpu", torch.float32, 16, None, True, tile=(16, 2, 1))
        run_decode("cpu", torch.float32, 8, 1, True, tile=(64, 8, 3))
        # The early load order (new K/V from registers, stored last), split and not, windows, caps.
        for splits, window, cap in ((None, 0, 0.0), (1, 0, 0.0), (3, 37, 0.0), (None, 5, 0.5)):
            run_decode("cpu", torch.float32, 16, splits, True, window, cap, tile=(32, 4, 2, True))
        run_decode("cpu", torch.float32, 8, 1, True, tile=(16, 2, 1, True))
        for norm in (True, False):
            run_decode_rope("cpu", torch.float32, norm, None)
            run_decode_rope("cpu", torch.float32, norm, 1)
            run_decode_rope("cpu", torch.float32, norm, None, early=True)
        # Score caps (Gemma 2), alone and with a window; 0.5 caps hard at these random scores.
        for window, cap in ((0, 0.5), (0, 50.0), (37, 0.5)):
            run_decode("cpu", torch.float32, 16, None, True, window, cap)
            run_prefill("cpu", torch.float32, 4, 2, 32, window, cap)
            run_mixed_padded("cpu", torch.float32, 8, 2, 32, 13, 5, window, cap)
    if "prefill_windows" in parts:
        run_prefill("cpu", torch.float32, 4, 2, 32)
        run_prefill("cpu", torch.float32, 3, 3, 24)
        run_mixed_padded("cpu", torch.float32, 8, 2, 32, extra_tokens=13, empty_rows=5)
        run_mixed_padded("cpu", torch.float32, 6, 1, 16, extra_tokens=0, empty_rows=1)
        # Few programs: each walks several query blocks, of several sequences.
        run_prefill("cpu", torch.float32, 4, 2, 32, num_sms=1)
        run_mixed_padded("cpu", torch.float32, 8, 2, 32, extra_tokens=13, empty_rows=5, num_sms=1)
        run_mixed_padded("cpu", torch.float32, 8, 2, 32, extra_tokens=13, empty_rows=5, num_sms=3)
        run_walk("cpu", torch.float32, programs=1, empty_rows=3)  # one program walks every block
        run_walk("cpu", torch.float32, programs=2, empty_rows=260, window=37)  # a table past 256
        for norm in (True, False):  # the rope launch that stores K/V
            run_varlen_rope("cpu", torch.float32, norm)
        # Sliding windows: shorter and longer than a tile (32 keys in fp32), not tile-aligned.
        for window in (5, 37, 100):
            run_decode("cpu", torch.float32, 16, None, True, window)
            run_decode("cpu", torch.float32, 8, 3, True, window)
            run_prefill("cpu", torch.float32, 4, 2, 32, window)
            run_mixed_padded("cpu", torch.float32, 8, 2, 32, 13, 5, window)
    if "fp8_rows" in parts:
        # An FP8 cache with scales: e4m3 rounding of every store, then stores and reads against
        # the reference (patch_interpreter rounds to e4m3 as the GPU does).
        run_fp8_store_rounding("cpu", torch.float32)
        for norm in (True, False):  # an FP8 cache keeps its own store launch
            run_varlen_rope("cpu", torch.float32, norm, fp8=True)
        for window, cap in ((0, 0.0), (37, 0.0), (0, 0.5)):
            run_fp8_reads("cpu", torch.float32, window, cap)
        for splits, fused, tile in ((None, True, None), (1, False, None), (3, True, (32, 4, 2, True))):
            run_decode("cpu", torch.float32, 16, splits, fused, fp8=True, tile=tile)
        run_prefill("cpu", torch.float32, 4, 2, 32, 37, fp8=True)
        # The last tokens alone (forward_rows), with windows, caps and the rope launch off.
        for window, cap, fuse in ((0, 0.0, True), (37, 0.5, True), (0, 0.0, False)):
            run_rows("cpu", torch.float32, window, cap, fuse_rope=fuse)
    if "host_args" in parts:
        run_host_arguments("cpu", torch.float32)
    print(DONE)
