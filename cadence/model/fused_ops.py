"""Fused elementwise ops of the decoder: RMSNorm, residual add + RMSNorm, q/k norm + RoPE, SwiGLU.

Each op has a plain-torch reference (``*_reference``), the arithmetic the CPU path runs and the
one transformers uses, and a Triton kernel (``*_triton``) that does the same in one launch on
CUDA. The public functions pick the kernel for CUDA tensors when Triton is importable and the
reference otherwise. The kernels compute in float32 and round to the activation dtype where the
reference does between steps, so in float32 they agree with the reference to a few ulps and in
half precision to about one rounding step. The RMSNorm kernel lives in ``rms_norm_kernels``, whose
arithmetic the skinny GEMM's fused-norm variant shares.

The kernels read only shapes on the host and allocate outputs by shape, so they are
CUDA-graph capturable. Row counts are grid sizes, never kernel arguments, so one compiled kernel
serves every batch size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cadence.model.rms_norm_kernels import as_rows, launch_parts_rms_norm, launch_rms_norm
from cadence.model.rope import apply_rotary, lookup_cos_sin
from cadence.model.split_k import KParts
from cadence.runtime.triton_launch import TritonLaunch, next_pow2

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None


if triton is not None:

    @triton.jit
    def _qk_norm_rope_kernel(
        q_ptr,
        k_ptr,
        q_out_ptr,
        k_out_ptr,
        qw_ptr,
        kw_ptr,
        pos_ptr,
        cos_sin_ptr,
        stride_qt,
        stride_qh,
        stride_kt,
        stride_kh,
        stride_qot,
        stride_qoh,
        stride_kot,
        stride_koh,
        stride_cs,
        eps,
        v_ptr,
        cache_ptr,
        slot_ptr,
        stride_vt,
        stride_vh,
        stride_c0,
        stride_c1,
        stride_c2,
        stride_c3,
        NUM_Q_HEADS: tl.constexpr,
        NUM_HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        HAS_NORM: tl.constexpr,
        BLOCK: tl.constexpr,
        BLOCK_H: tl.constexpr,
        STORE: tl.constexpr,
        PAGE: tl.constexpr,
    ):
        # One program: BLOCK_H heads of one token, q heads first, then k heads (a tile of
        # BLOCK_H x half head_dim; a program per (token, head) was bound by block scheduling).
        # STORE: the k heads (as k_out holds them) and the token's v also go to the paged
        # cache at the token's slot (none for a negative slot), as _store_kv_kernel writes a
        # cache that is not FP8.
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        half: tl.constexpr = HEAD_DIM // 2
        offs = tl.arange(0, BLOCK)
        is_q = h < NUM_Q_HEADS
        is_k = (h >= NUM_Q_HEADS) & (h < NUM_HEADS)
        dmask = offs < half
        mq = is_q[:, None] & dmask[None, :]
        mk = is_k[:, None] & dmask[None, :]
        hk = h - NUM_Q_HEADS
        q_src = q_ptr + t * stride_qt + h[:, None] * stride_qh + offs[None, :]
        k_src = k_ptr + t * stride_kt + hk[:, None] * stride_kh + offs[None, :]
        x1 = tl.load(q_src, mask=mq, other=0.0).to(tl.float32)
        x1 += tl.load(k_src, mask=mk, other=0.0).to(tl.float32)
        x2 = tl.load(q_src + half, mask=mq, other=0.0).to(tl.float32)
        x2 += tl.load(k_src + half, mask=mk, other=0.0).to(tl.float32)
        if HAS_NORM:
            ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
            rstd = tl.math.rsqrt(ss / HEAD_DIM + eps)[:, None]
            qw1 = tl.load(qw_ptr + offs, mask=dmask, other=0.0).to(tl.float32)[None, :]
            qw2 = tl.load(qw_ptr + half + offs, mask=dmask, other=0.0).to(tl.float32)[None, :]
            kw1 = tl.load(kw_ptr + offs, mask=dmask, other=0.0).to(tl.float32)[None, :]
            kw2 = tl.load(kw_ptr + half + offs, mask=dmask, other=0.0).to(tl.float32)[None, :]
            w1 = tl.where(is_q[:, None], qw1, kw1)
            w2 = tl.where(is_q[:, None], qw2, kw2)
            # Rounded like the reference: normalize, round, scale, round.
            x1 = (x1 * rstd).to(q_ptr.dtype.element_ty).to(tl.float32) * w1
            x2 = (x2 * rstd).to(q_ptr.dtype.element_ty).to(tl.float32) * w2
            x1 = x1.to(q_ptr.dtype.element_ty).to(tl.float32)
            x2 = x2.to(q_ptr.dtype.element_ty).to(tl.float32)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        cos = tl.load(cos_sin_ptr + pos * stride_cs + offs, mask=dmask, other=0.0)
        sin = tl.load(cos_sin_ptr + pos * stride_cs + half + offs, mask=dmask, other=0.0)
        cos = cos.to(tl.float32)[None, :]
        sin = sin.to(tl.float32)[None, :]
        out_ty = q_out_ptr.dtype.element_ty
        y1 = (x1 * cos - x2 * sin).to(out_ty)
        y2 = (x2 * cos + x1 * sin).to(out_ty)
        q_dst = q_out_ptr + t * stride_qot + h[:, None] * stride_qoh + offs[None, :]
        k_dst = k_out_ptr + t * stride_kot + hk[:, None] * stride_koh + offs[None, :]
        tl.store(q_dst, y1, mask=mq)
        tl.store(q_dst + half, y2, mask=mq)
        tl.store(k_dst, y1, mask=mk)
        tl.store(k_dst + half, y2, mask=mk)
        if STORE:
            slot = tl.load(slot_ptr + t).to(tl.int64)
            ms = mk & (slot >= 0)
            safe = tl.maximum(slot, 0)
            dst = (safe // PAGE) * stride_c1 + (safe % PAGE) * stride_c2
            dst = cache_ptr + dst + hk[:, None] * stride_c3 + offs[None, :]
            cache_ty = cache_ptr.dtype.element_ty
            tl.store(dst, y1.to(cache_ty), mask=ms)
            tl.store(dst + half, y2.to(cache_ty), mask=ms)
            v_src = v_ptr + t * stride_vt + hk[:, None] * stride_vh + offs[None, :]
            v1 = tl.load(v_src, mask=ms, other=0.0)
            v2 = tl.load(v_src + half, mask=ms, other=0.0)
            tl.store(dst + stride_c0, v1.to(cache_ty), mask=ms)
            tl.store(dst + stride_c0 + half, v2.to(cache_ty), mask=ms)

    @triton.jit
    def _silu_and_mul_kernel(
        x_ptr,
        out_ptr,
        stride_x,
        stride_o,
        D: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < D
        gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * stride_x + D + offs, mask=mask, other=0.0).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty).to(tl.float32)
        tl.store(
            out_ptr + row * stride_o + offs, (act * up).to(out_ptr.dtype.element_ty), mask=mask
        )


    # Launched through the compiled kernels' own launchers after the first call (see
    # cadence.runtime.triton_launch): the eager path's per-launch host cost.
    _QK_NORM_ROPE = TritonLaunch(_qk_norm_rope_kernel)
    _SILU_AND_MUL = TritonLaunch(_silu_and_mul_kernel)


def triton_available() -> bool:
    return triton is not None


def _use_triton(x: torch.Tensor) -> bool:
    return triton is not None and x.is_cuda


# --- references -------------------------------------------------------------------------------


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: normalize in float32, cast back, then scale."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    new_residual = residual + x
    return rms_norm_reference(new_residual, weight, eps), new_residual


def qk_norm_rope_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    if q_weight is not None and k_weight is not None:
        q = rms_norm_reference(q, q_weight, eps)
        k = rms_norm_reference(k, k_weight, eps)
    cos, sin = lookup_cos_sin(cos_sin, positions)
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# --- Triton launchers -------------------------------------------------------------------------


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return launch_rms_norm(x, None, weight.contiguous(), eps)[0]


def add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    out, new_residual = launch_rms_norm(x, residual, weight.contiguous(), eps)
    assert new_residual is not None
    return out, new_residual


@dataclass(frozen=True)
class KVStore:
    """Where ``qk_norm_rope_triton`` also writes the rotated keys and ``v``: the paged
    ``kv_cache`` (``[2, blocks, page, kv_heads, head_dim]``, not FP8) at ``slot_mapping``, as
    ``triton_attention.store_kv_cache`` would."""

    v: torch.Tensor
    kv_cache: torch.Tensor
    slot_mapping: torch.Tensor


def qk_norm_rope_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    store: KVStore | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``qk_norm_rope`` in one launch; with ``store``, the same launch writes the cache."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if head_dim % 2 or k.shape[2] != head_dim or cos_sin.shape[-1] != head_dim:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, table {tuple(cos_sin.shape)}")
    weights = [w for w in (q_weight, k_weight) if w is not None]
    if any(t.dtype != q.dtype for t in (k, *weights)):
        raise ValueError("q, k and the norm weights must share one dtype")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    cos_sin, positions = cos_sin.contiguous(), positions.contiguous()
    out_dtype = torch.promote_types(q.dtype, cos_sin.dtype)
    q_out = torch.empty(q.shape, dtype=out_dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=out_dtype, device=k.device)
    has_norm = q_weight is not None and k_weight is not None
    qw = q_weight.contiguous() if q_weight is not None else q
    kw = k_weight.contiguous() if k_weight is not None else k
    if num_tokens > 0:
        block = next_pow2(head_dim // 2)
        total = num_heads + num_kv_heads
        block_h = min(next_pow2(total), max(1, 2048 // block))
        _QK_NORM_ROPE(
            (num_tokens, triton.cdiv(total, block_h)),
            (
                q,
                k,
                q_out,
                k_out,
                qw,
                kw,
                positions,
                cos_sin,
                q.stride(0),
                q.stride(1),
                k.stride(0),
                k.stride(1),
                q_out.stride(0),
                q_out.stride(1),
                k_out.stride(0),
                k_out.stride(1),
                cos_sin.stride(0),
                eps,
                *_store_args(store, k_out),
            ),
            NUM_Q_HEADS=num_heads,
            NUM_HEADS=total,
            HEAD_DIM=head_dim,
            HAS_NORM=has_norm,
            BLOCK=block,
            BLOCK_H=block_h,
            STORE=store is not None,
            PAGE=1 if store is None else store.kv_cache.shape[2],
            num_warps=4 if block * block_h >= 1024 else 1,
        )
    return q_out, k_out


def _store_args(store: KVStore | None, k_out: torch.Tensor) -> tuple:
    """The kernel's cache arguments (unread placeholders without ``store``)."""
    if store is None:
        return (k_out, k_out, k_out, 0, 0, 0, 0, 0, 0)
    v, cache = store.v, store.kv_cache
    if v.stride(-1) != 1:
        v = v.contiguous()
    if (cache.dim() != 5 or cache.shape[0] != 2 or cache.stride(-1) != 1
            or v.shape != k_out.shape or cache.shape[3:] != k_out.shape[1:]
            or cache.dtype == torch.float8_e4m3fn):
        raise ValueError(f"v {tuple(v.shape)} and cache {tuple(cache.shape)} ({cache.dtype}) "
                         f"do not fit k {tuple(k_out.shape)}")
    return (v, cache, store.slot_mapping, v.stride(0), v.stride(1), *cache.stride()[:4])


def silu_and_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    shape, width = gate_up.shape, gate_up.shape[-1]
    if width % 2:
        raise ValueError(f"gate_up needs an even last dimension, got {width}")
    d = width // 2
    x2 = as_rows(gate_up)
    out = torch.empty((x2.shape[0], d), dtype=gate_up.dtype, device=gate_up.device)
    if x2.shape[0] > 0:
        block = min(1024, next_pow2(d))
        _SILU_AND_MUL(
            (x2.shape[0], triton.cdiv(d, block)),
            (
                x2,
                out,
                x2.stride(0),
                out.stride(0),
            ),
            D=d,
            BLOCK=block,
            num_warps=4 if block >= 512 else 1,
        )
    return out.view(*shape[:-1], d)


# --- dispatch ---------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension."""
    if _use_triton(x):
        return rms_norm_triton(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor | KParts, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(residual + x), residual + x)``; the sum is the next residual stream. ``x``
    may be a K-split projection's partial sums (``KParts``): the kernel adds them up first."""
    if isinstance(x, KParts):
        if _use_triton(x.parts) and residual.dtype == x.dtype and residual.is_contiguous():
            out, new_residual = launch_parts_rms_norm(x.parts, x.dtype, residual,
                                                      weight.contiguous(), eps)
            return out.view(residual.shape), new_residual.view(residual.shape)
        x = x.total().view(residual.shape)
    if _use_triton(x):
        return add_rms_norm_triton(x, residual, weight, eps)
    return add_rms_norm_reference(x, residual, weight, eps)


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm of q ``[T, heads, d]`` and k ``[T, kv_heads, d]`` (only when both weights
    are given), then rotate-half RoPE at ``positions [T]`` with the ``[max_pos, d]`` table
    (cos in the first half, sin in the second). Returns new tensors; the inputs are unchanged."""
    if _use_triton(q):
        return qk_norm_rope_triton(q, k, positions, cos_sin, q_weight, k_weight, eps)
    return qk_norm_rope_reference(q, k, positions, cos_sin, q_weight, k_weight, eps)


def norm_and_project(linear: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor | KParts,
                     residual: torch.Tensor | None, weight: torch.Tensor, eps: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(linear(h), s)`` for ``h, s = add_rms_norm(x, residual, weight, eps)``; without a
    residual ``h = rms_norm(x, weight, eps)`` and ``s = x``: a norm kernel, then the projection."""
    if residual is None:
        if isinstance(x, KParts):
            x = x.total()
        return linear(rms_norm(x, weight, eps)), x
    h, residual = add_rms_norm(x, residual, weight, eps)
    return linear(h), residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused ``[..., 2 * d]`` gate/up projection: ``silu(gate) * up``."""
    if _use_triton(gate_up):
        return silu_and_mul_triton(gate_up)
    return silu_and_mul_reference(gate_up)
