"""Causal attention of one sequence over its own contiguous keys: a Triton kernel with short
query blocks, for the dense prefill path (``dense_prefill``).

A lone prompt prefilled from position 0 has one long chain of work per query block: its last
block walks every key. cuDNN's 128-query tiles make that chain long; this kernel's 64-query
blocks (one query head each) halve it, and its programs run heaviest first, the second round of
programs lightest first so each SM's pair of programs carries about equal work. On an H100
(docs/perf.md, runs ZZN-ZZQ) it beats the paged varlen kernel at every length and cuDNN up to a
causal work of about ``dense_prefill.TRITON_MAX_WORK`` (ties it at 1,024 tokens of 16 heads).

Importing this module without Triton installed defines nothing; ``causal_attention`` then
raises.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None

from cadence.model.triton_attention import _score_scales  # the paged kernels' scales
from cadence.model.triton_decode_kernels import _tanh  # and their soft cap

__all__ = ["CausalTile", "causal_attention", "causal_attention_kernel"]

causal_attention_kernel = None

if triton is not None:

    @triton.jit
    def _causal_tile(q, acc, m_i, l_i, k_base, v_base, stride_kt, stride_vt, n0, tok,
                     num_tokens, offs_d, dmask, window, qk_scale, cap_scale,
                     BLOCK_N: tl.constexpr,
                     MASK: tl.constexpr, SLIDING: tl.constexpr, SOFTCAP: tl.constexpr):
        """One key/value tile of the online softmax (q carries the scale, in log2 units;
        with ``SOFTCAP`` the scores take ``qk_scale``, the scale over the cap, in float32, and
        ``cap_scale`` is the cap in log2 units)."""
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n < num_tokens)[:, None] & dmask[None, :]
        k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kt + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        s = tl.dot(q, k.T)
        if SOFTCAP:
            s = cap_scale * _tanh(s * qk_scale)
        if MASK:
            keep = offs_n[None, :] <= tok[:, None]
            if SLIDING:
                keep = keep & (offs_n[None, :] > tok[:, None] - window)
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASK and SLIDING:
            # A row may see no key of a tile before its window starts: m_new stays -inf, and
            # the exponentials use 0 in its place (alpha and p are then 0 for that row).
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            # Key 0 is in the first tile and visible to every row (no window), and a tile
            # without a mask is visible to every row: m_new is finite.
            m_use = m_new
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vt + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        return acc, m_new, l_i

    @triton.jit
    def causal_attention_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt,
        stride_vh, stride_ot, stride_oh, num_tokens, num_blocks, qk_scale, sms, window,
        cap_scale, GROUP: tl.constexpr, PACK: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        SLIDING: tl.constexpr, SOFTCAP: tl.constexpr,
    ):  # fmt: skip
        """Program (head pack, launch round): rows are PACK query heads x BLOCK_M tokens,
        head-major; the PACK heads share one kv head. Programs take query blocks heaviest
        first (the block axis is the slow one, from the end); with ``sms`` > 0 the second
        round of programs (one more per SM) takes them lightest first instead, so the SM that
        took the k-th heaviest also takes about the k-th lightest. BLOCK_M is a multiple of
        BLOCK_N."""
        packs = tl.num_programs(0)
        launch = tl.program_id(1) * packs + tl.program_id(0)
        rank = launch
        if sms > 0:
            second = tl.minimum(packs * num_blocks, 2 * sms)
            if (launch >= sms) & (launch < second):
                rank = second - 1 - (launch - sms)
        hp = rank % packs
        start_m = (num_blocks - 1 - rank // packs) * BLOCK_M
        rows = tl.arange(0, PACK * BLOCK_M)
        tok = start_m + rows % BLOCK_M
        head = hp * PACK + rows // BLOCK_M
        kvh = (hp * PACK) // GROUP
        offs_d = tl.arange(0, BLOCK_D)
        dmask = offs_d < HEAD_DIM
        row_mask = (tok < num_tokens)[:, None] & dmask[None, :]
        q = tl.load(q_ptr + tok[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh
                    + offs_d[None, :], mask=row_mask, other=0.0)
        if not SOFTCAP:
            q = (q.to(tl.float32) * qk_scale).to(q.dtype)
        # NOTE: a capped layer's q is not scaled in its own dtype: rounding the scaled q moves
        # scores past the cap by more than bf16 output rounding (the paged kernels scale s).
        k_base = k_ptr + kvh * stride_kh
        v_base = v_ptr + kvh * stride_vh
        m_i = tl.full([PACK * BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([PACK * BLOCK_M], tl.float32)
        acc = tl.zeros([PACK * BLOCK_M, BLOCK_D], tl.float32)
        # Keys before the block's first query are seen by every row (no mask), except, with a
        # window, those before the last row's window starts: the block's first row sees keys
        # from start_m - window + 1 on, its last from start_m + BLOCK_M - window on.
        if SLIDING:
            kv_start = tl.maximum(start_m - window + 1, 0) // BLOCK_N * BLOCK_N
            full_start = tl.minimum(
                tl.cdiv(tl.maximum(start_m + BLOCK_M - window, 0), BLOCK_N) * BLOCK_N, start_m)
            for n0 in range(kv_start, full_start, BLOCK_N):
                acc, m_i, l_i = _causal_tile(
                    q, acc, m_i, l_i, k_base, v_base, stride_kt, stride_vt, n0, tok, num_tokens,
                    offs_d, dmask, window, qk_scale, cap_scale, BLOCK_N, True, SLIDING, SOFTCAP)
        else:
            full_start = 0
        for n0 in range(full_start, start_m, BLOCK_N):
            acc, m_i, l_i = _causal_tile(
                q, acc, m_i, l_i, k_base, v_base, stride_kt, stride_vt, n0, tok, num_tokens,
                offs_d, dmask, window, qk_scale, cap_scale, BLOCK_N, False, SLIDING, SOFTCAP)
        for n0 in range(start_m, start_m + BLOCK_M, BLOCK_N):
            acc, m_i, l_i = _causal_tile(
                q, acc, m_i, l_i, k_base, v_base, stride_kt, stride_vt, n0, tok, num_tokens,
                offs_d, dmask, window, qk_scale, cap_scale, BLOCK_N, True, SLIDING, SOFTCAP)
        out = acc / l_i[:, None]
        tl.store(o_ptr + tok[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh
                 + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=row_mask)


@dataclass(frozen=True)
class CausalTile:
    """The kernel's tile: ``block_m`` query tokens of ``pack`` heads per program against
    ``block_n`` keys per step, and the launch's warps and pipeline stages. ``balanced``: the
    second round of programs runs lightest first (needs the SM count)."""

    block_m: int = 64
    pack: int = 1
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    balanced: bool = True

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {value}")
        if self.block_m % self.block_n:
            raise ValueError(f"block_m ({self.block_m}) must be a multiple of block_n "
                             f"({self.block_n})")
        if self.pack < 1 or self.pack & (self.pack - 1):
            raise ValueError(f"pack must be a power of two >= 1, got {self.pack}")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(f"bad launch options: {self.num_warps} warps, "
                             f"{self.num_stages} stages")


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                     scale: float, num_sms: int = 0, tile: CausalTile | None = None,
                     sliding_window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """Causal attention of ``q`` ``[T, H, D]`` over ``k``, ``v`` ``[T, Hkv, D]`` as one sequence
    from position 0, into ``out`` ``[T, H, D]`` (each with a contiguous last dim; any row and
    head strides). ``num_sms``: the device's SM count, for the balanced order (0: heaviest
    first throughout). ``sliding_window`` > 0: the query at position t sees keys t - window + 1
    to t; ``softcap`` > 0: scores become ``softcap * tanh(score / softcap)`` (as the paged
    kernels)."""
    if triton is None:
        raise ImportError("causal_attention needs triton (shipped with torch's CUDA builds)")
    tile = tile or CausalTile()
    t, h, d = q.shape
    hk = k.shape[1]
    if k.shape != (t, hk, d) or v.shape != k.shape or out.shape != q.shape or h % hk:
        raise ValueError(f"shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, out {tuple(out.shape)}")
    if any(x.stride(2) != 1 for x in (q, k, v, out)):
        raise ValueError("q, k, v and out need a contiguous last dim")
    group = h // hk
    if group % tile.pack:
        raise ValueError(f"pack {tile.pack} does not divide the {group} query heads per kv head")
    if sliding_window < 0 or softcap < 0:
        raise ValueError(f"sliding_window and softcap must be >= 0, got {sliding_window}, "
                         f"{softcap}")
    if t == 0:
        return out
    blocks = triton.cdiv(t, tile.block_m)
    qk_scale, cap_scale = _score_scales(scale, softcap)  # q carries qk_scale without a cap
    sliding = 0 < sliding_window < t  # a window of at least T keys hides nothing
    causal_attention_kernel[(h // tile.pack, blocks)](
        q, k, v, out, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), out.stride(0), out.stride(1), t, blocks, qk_scale,
        num_sms if tile.balanced else 0, sliding_window if sliding else 0, cap_scale,
        GROUP=group, PACK=tile.pack, HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d),
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, SLIDING=sliding, SOFTCAP=softcap > 0,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )  # fmt: skip
    return out
