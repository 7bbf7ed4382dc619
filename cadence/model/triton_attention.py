"""Triton attention over the paged KV cache: fused KV store, paged decode, varlen prefill.

Cache layout ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (0 = keys, 1 = values),
any strides with a contiguous last dimension. Every kernel takes its per-sequence data from
device tensors (``seq_lens``, ``query_start_loc``, ``block_tables``, ``slot_mapping``); the host
only reads shapes and ``max_query_len``, so the decode path is CUDA-graph capturable.

Decode: one program per (sequence, kv head, split) handles all query heads of its group (GQA)
with a tensor-core dot, and also stores the sequence's new K/V (no separate store launch); short
batches split each sequence's context into ``num_splits`` chunks
(split-K) whose partial results a second kernel merges. The split count depends only on shapes
(batch, kv heads, block-table width) and the device, never on sequence lengths.
Varlen (prefill, chunked prefill, mixed batches): a causal flash-attention per (query block of
one sequence, kv head) over all query heads of the group, reading keys and values from the
cache, queries at positions ``seq_len - query_len ...``; a program per (kv head, slot) walks
query blocks slot, slot + P, ... (the longest first), so its grid depends on the token and
sequence counts only and a mixed step is CUDA-graph capturable too.

Padding sequences (``seq_len == 0`` or an empty query range) read nothing and write nothing:
their output rows are left unspecified (the reference backend zeroes them).
"""

from __future__ import annotations

import torch

from cadence.model.attention_metadata import AttentionMetadata, QKRope
from cadence.model.attention_tiles import (
    DecodeConfig,
    VarlenConfig,
    choose_num_splits,
    decode_config,
    varlen_config,
    varlen_programs,
)
from cadence.model.triton_attention_kernels import _store_kv_kernel, _varlen_kernel
from cadence.model.triton_decode_early import _decode_early_kernel
from cadence.model.triton_decode_kernels import _decode_kernel, _merge_splits_kernel
from cadence.runtime.triton_launch import TritonLaunch, next_pow2, pdl_enabled

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None

_LOG2E = 1.4426950408889634
# Up to this many sequences the varlen kernel holds the sequence table in registers through its
# walk; longer tables are read again per query block (their registers would crowd the tiles').
_TABLE_IN_REGISTERS = 256
_FP8 = torch.float8_e4m3fn
if triton is not None:
    _STORE_KV = TritonLaunch(_store_kv_kernel)
    _DECODE = TritonLaunch(_decode_kernel)
    _DECODE_EARLY = TritonLaunch(_decode_early_kernel)
    _MERGE_SPLITS = TritonLaunch(_merge_splits_kernel)
    _VARLEN = TritonLaunch(_varlen_kernel)


def _require_triton() -> None:
    if triton is None:
        raise ImportError("TritonAttentionBackend needs triton (shipped with torch's CUDA builds)")


def _check_cache(kv_cache: torch.Tensor) -> None:
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2 or kv_cache.stride(-1) != 1:
        raise ValueError(
            "kv_cache must be [2, num_blocks, block_size, num_kv_heads, head_dim] with a "
            f"contiguous last dimension, got shape {tuple(kv_cache.shape)}"
        )


def _score_scales(scale: float, softcap: float) -> tuple[float, float]:
    """(qk_scale, cap_scale) of the kernels, whose scores are in log2 units: ``dot * qk_scale``
    without a cap, ``cap_scale * tanh(dot * qk_scale)`` with one."""
    if softcap > 0:
        return scale / softcap, softcap * _LOG2E
    return scale * _LOG2E, 0.0


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def store_kv_cache(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: float = 1.0, v_scale: float = 1.0,
) -> None:
    """Write token ``t``'s key and value at ``slot_mapping[t]`` (``block * block_size + offset``);
    tokens with a negative slot are skipped. One program per token of ``k``. An FP8 cache
    holds ``k / k_scale`` and ``v / v_scale``, saturated."""
    _require_triton()
    _check_cache(kv_cache)
    k, v = _last_dim_contiguous(k), _last_dim_contiguous(v)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _STORE_KV(
        (num_tokens,),
        (
            k,
            v,
            kv_cache,
            slot_mapping,
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            kv_cache.stride(0),
            kv_cache.stride(1),
            kv_cache.stride(2),
            kv_cache.stride(3),
            1.0 / k_scale,
            1.0 / v_scale,
        ),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        PAGE=kv_cache.shape[2],
        BLOCK_H=next_pow2(num_kv_heads),
        BLOCK_D=next_pow2(head_dim),
        FP8=kv_cache.dtype == _FP8,
        num_warps=1 if num_kv_heads * head_dim <= 512 else 4,
    )


def rope_fusable(q: torch.Tensor, k: torch.Tensor, rope: QKRope) -> bool:
    """Whether the decode kernel can apply ``rope`` itself: the arithmetic of
    ``fused_ops.qk_norm_rope`` in q's dtype (table and weights in it, contiguous) and an even
    head size."""
    head_dim = q.shape[-1]
    weights = [w for w in (rope.q_weight, rope.k_weight) if w is not None]
    return (head_dim % 2 == 0 and rope.cos_sin.shape[-1] == head_dim
            and rope.cos_sin.stride(-1) == 1 and rope.positions.is_contiguous()
            and all(t.dtype == q.dtype for t in (k, rope.cos_sin, *weights))
            and all(w.is_contiguous() and w.shape == (head_dim,) for w in weights))


def paged_decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    out: torch.Tensor,
    num_sms: int,
    num_splits: int | None = None,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    sliding_window: int = 0,
    softcap: float = 0.0,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    rope: QKRope | None = None,
    config: DecodeConfig | None = None,
    qkv_releases_early: bool = False,
) -> None:
    """Decode (one query token per sequence) attention into ``out`` [T, num_heads, head_dim].
    With ``sliding_window`` W > 0 each query sees its last W keys only; ``softcap`` c > 0 caps
    the scaled scores to ``c * tanh(s / c)``.

    With ``k`` and ``v`` given, each sequence's new key and value are first written to the cache
    at ``metadata.slot_mapping`` inside the same kernel (no separate store launch); tokens that
    belong to no sequence (padding) are not written. With ``rope`` (and ``k``, ``v``), q and the
    new k get their norms and RoPE in the kernel's loads (``rope_fusable`` must hold).
    ``config`` overrides the tile (``decode_config``'s by default, told whether the kernel
    before releases early by ``qkv_releases_early``; its ``early`` load order applies only with
    ``k`` and ``v``)."""
    _require_triton()
    _check_cache(kv_cache)
    store = k is not None and v is not None
    if store:
        k, v = _last_dim_contiguous(k), _last_dim_contiguous(v)
    else:
        k = v = q  # unused
    if rope is not None and not (store and rope_fusable(q, k, rope)):
        raise ValueError("rope in the decode kernel needs k and v and rope_fusable(q, k, rope)")
    norm = rope is not None and rope.q_weight is not None and rope.k_weight is not None
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, page = kv_cache.shape[3], kv_cache.shape[2]
    group = num_heads // num_kv_heads
    num_seqs = metadata.seq_lens.shape[0]
    block_tables = metadata.block_tables
    fp32 = q.dtype == torch.float32
    pdl = pdl_enabled(q.device)
    cfg = decode_config(fp32, num_seqs, pdl, qkv_releases_early) if config is None else config
    if num_splits is None:
        max_context = block_tables.shape[1] * page
        if sliding_window > 0:
            max_context = min(max_context, sliding_window)
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_context, num_sms, cfg.block_n)
    # An FP8 cache's key scale multiplies every score; other caches are unscaled.
    fp8 = kv_cache.dtype == _FP8
    qk_scale, cap_scale = _score_scales(scale * k_scale if fp8 else scale, softcap)
    split = num_splits > 1
    early = store and cfg.early
    if split:
        part_acc = torch.empty(
            (num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        part_ml = torch.empty(
            (num_seqs, num_heads, num_splits, 2), dtype=torch.float32, device=q.device
        )
    else:
        part_acc = part_ml = out  # unused
    store_flag = {} if early else {"STORE": store}  # the early kernel always stores
    (_DECODE_EARLY if early else _DECODE)(
        (num_seqs, num_kv_heads, num_splits),
        (
            q,
            kv_cache,
            out,
            part_acc,
            part_ml,
            k,
            v,
            metadata.slot_mapping,
            metadata.seq_lens,
            metadata.query_start_loc,
            block_tables,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            out.stride(0),
            out.stride(1),
            kv_cache.stride(0),
            kv_cache.stride(1),
            kv_cache.stride(2),
            kv_cache.stride(3),
            block_tables.stride(0),
            qk_scale,
            num_splits,
            sliding_window,
            cap_scale,
            v_scale,
            1.0 / k_scale,
            1.0 / v_scale,
            rope.positions if rope is not None else metadata.seq_lens,
            rope.cos_sin if rope is not None else q,
            rope.cos_sin.stride(0) if rope is not None else 0,
            rope.q_weight if norm else q,
            rope.k_weight if norm else q,
            rope.eps if norm else 0.0,
        ),
        NUM_HEADS=num_heads,
        GROUP=group,
        HEAD_DIM=head_dim,
        PAGE=page,
        BLOCK_G=next_pow2(group, 16),
        BLOCK_D=next_pow2(head_dim, 16),
        BLOCK_N=cfg.block_n,
        SPLIT=split,
        **store_flag,
        SLIDING=sliding_window > 0,
        SOFTCAP=softcap > 0,
        IEEE=fp32,
        FP8=fp8,
        ROPE=rope is not None,
        QK_NORM=norm,
        pdl=pdl,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if split:
        _MERGE_SPLITS(
            (num_seqs, num_heads),
            (
                part_acc,
                part_ml,
                out,
                metadata.seq_lens,
                metadata.query_start_loc,
                out.stride(0),
                out.stride(1),
                num_splits,
            ),
            NUM_HEADS=num_heads,
            HEAD_DIM=head_dim,
            BLOCK_S=next_pow2(num_splits),
            BLOCK_D=next_pow2(head_dim),
            pdl=pdl,
            num_warps=1 if head_dim <= 64 else 2,
        )


def paged_varlen_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    out: torch.Tensor,
    config: VarlenConfig | None = None,
    sliding_window: int = 0,
    softcap: float = 0.0,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    num_sms: int | None = None,
    programs: int | None = None,
) -> None:
    """Causal varlen attention of any batch (prefill, chunked prefill, mixed) into ``out``;
    with ``sliding_window`` W > 0 a query at position p sees keys p - W + 1 ... p only, and
    ``softcap`` c > 0 caps the scaled scores to ``c * tanh(s / c)``.

    The grid depends only on the number of tokens and sequences (``q.shape[0]`` and
    ``seq_lens.shape[0]``) and ``num_sms`` (``varlen_programs``), never on their lengths, so
    one launch serves every batch that pads to the same shapes (CUDA graphs of mixed steps).
    Padding tokens and sequences with ``seq_len == 0`` or an empty query range produce no
    output. ``programs`` overrides the programs per kv head (tests, sweeps)."""
    _require_triton()
    _check_cache(kv_cache)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, page = kv_cache.shape[3], kv_cache.shape[2]
    num_seqs = metadata.seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return
    group = num_heads // num_kv_heads
    fp32 = q.dtype == torch.float32
    cfg = config or varlen_config(num_tokens, fp32)
    block_q = cfg.block_q(group)
    per_head = programs or varlen_programs(num_tokens, block_q, num_seqs, num_kv_heads, num_sms)
    grid = (num_kv_heads, per_head)
    block_s = next_pow2(num_seqs, 16)
    # An FP8 cache's key scale multiplies every score; other caches are unscaled.
    fp8 = kv_cache.dtype == _FP8
    qk_scale, cap_scale = _score_scales(scale * k_scale if fp8 else scale, softcap)
    _VARLEN(
        grid,
        (
            q,
            kv_cache,
            out,
            metadata.seq_lens,
            metadata.query_start_loc,
            metadata.block_tables,
            q.stride(0),
            q.stride(1),
            out.stride(0),
            out.stride(1),
            kv_cache.stride(0),
            kv_cache.stride(1),
            kv_cache.stride(2),
            kv_cache.stride(3),
            metadata.block_tables.stride(0),
            qk_scale,
            num_seqs,
            sliding_window,
            cap_scale,
            v_scale,
        ),
        GROUP=group,
        GROUP_P=next_pow2(group),
        HEAD_DIM=head_dim,
        PAGE=page,
        BLOCK_Q=block_q,
        BLOCK_S=block_s,
        RELOAD=block_s > _TABLE_IN_REGISTERS,
        BLOCK_N=cfg.block_n,
        BLOCK_D=next_pow2(head_dim, 16),
        SLIDING=sliding_window > 0,
        SOFTCAP=softcap > 0,
        IEEE=fp32,
        FP8=fp8,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
