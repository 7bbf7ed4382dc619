"""Mixture-of-experts MLP for decode steps of a few tokens: two Triton kernels, no grouping.

With a handful of (token, expert) pairs every pair has its own expert, so sorting pairs by expert
(``moe.group_by_expert``) and padding each run to a tensor-core tile buys nothing. Here:

- ``_decode_gate_up_kernel``: program ``(pair, column block)`` reads its token's activations and
  ``BLOCK_N`` gate and up rows of the pair's expert, multiply-adds on the CUDA cores and writes
  ``silu(gate) * up`` for the pair;
- ``_decode_down_kernel``: program ``(token, column block)`` reads ``BLOCK_N`` down rows of all
  the token's ``TOP_K`` experts at once (``[TOP_K, BLOCK_N, BLOCK_K]`` tiles, every expert's
  loads in flight together) against the pairs' intermediate activations; the sum over the
  experts, weighted by the routing weights, is one reduction in registers in a fixed order (one
  result, whatever order the programs run in), and the output is written once.

Two launches instead of four (grouping, two grouped GEMMs, the sum over the top k). Each expert
a token reaches is read once per token, so this pays only while few tokens share an expert:
``moe.fused_moe_triton`` takes it where ``moe.decode_tile`` has a measured tile (up to 64 pairs,
128 with FP8 experts; ``decode=True`` forces it, ``decode=False`` forbids it). FP8 experts (e4m3 rows and
row scales) convert their tiles and scale the sums as the grouped kernels do. Expert ids are
clamped into range (a CUDA graph's padding rows may route garbage).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cadence.runtime.triton_launch import TritonLaunch, next_pow2

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None

__all__ = ["DecodeTile", "fused_moe_decode"]


@dataclass(frozen=True)
class DecodeTile:
    block_n: int = 16
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3


_decode_gate_up_kernel = _decode_down_kernel = None

if triton is not None:

    @triton.jit
    def _decode_gate_up_kernel(
        x_ptr, w_ptr, ids_ptr, scale_ptr, out_ptr, stride_xt, stride_we, stride_wn, stride_ot,
        TOP_K: tl.constexpr, NUM_EXPERTS: tl.constexpr, HIDDEN: tl.constexpr,
        INTER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP8: tl.constexpr,
    ):  # fmt: skip
        pair = tl.program_id(0).to(tl.int64)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < INTER
        rows = tl.minimum(offs_n, INTER - 1).to(tl.int64)  # in bounds: no mask on the stream
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        expert = tl.minimum(tl.maximum(expert, 0), NUM_EXPERTS - 1)
        token = pair // TOP_K
        w_gate = w_ptr + expert * stride_we + rows[:, None] * stride_wn
        w_up = w_gate + INTER * stride_wn
        acc_g = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, HIDDEN, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            kmask = offs_k < HIDDEN
            a = tl.load(x_ptr + token * stride_xt + offs_k, mask=kmask, other=0.0).to(tl.float32)
            g = tl.load(w_gate + offs_k[None, :], mask=kmask[None, :], other=0.0)
            u = tl.load(w_up + offs_k[None, :], mask=kmask[None, :], other=0.0)
            acc_g += g.to(tl.float32) * a[None, :]
            acc_u += u.to(tl.float32) * a[None, :]
        gate = tl.sum(acc_g, axis=1)
        up = tl.sum(acc_u, axis=1)
        if FP8:
            scales = scale_ptr + expert * 2 * INTER + rows
            gate = gate * tl.load(scales)
            up = up * tl.load(scales + INTER)
        h = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + pair * stride_ot + offs_n, h.to(out_ptr.dtype.element_ty), mask=nmask)

    @triton.jit
    def _decode_down_kernel(
        h_ptr, w_ptr, ids_ptr, weight_ptr, scale_ptr, out_ptr, stride_ht, stride_we,
        stride_wn, stride_ot,
        TOP_K: tl.constexpr, NUM_EXPERTS: tl.constexpr, HIDDEN: tl.constexpr,
        INTER: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, FP8: tl.constexpr,
    ):  # fmt: skip
        # All TOP_K experts of the token in one [BLOCK_J, BLOCK_N, BLOCK_K] tile per step: the
        # loads of every expert are in flight together (a loop over the experts restarts its
        # pipeline per expert), and the weighted sum over them is one fixed-order reduction.
        token = tl.program_id(0).to(tl.int64)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < HIDDEN
        rows = tl.minimum(offs_n, HIDDEN - 1).to(tl.int64)
        offs_j = tl.arange(0, BLOCK_J)
        jmask = offs_j < TOP_K
        pairs = token * TOP_K + tl.minimum(offs_j, TOP_K - 1)
        experts = tl.load(ids_ptr + pairs).to(tl.int64)
        experts = tl.minimum(tl.maximum(experts, 0), NUM_EXPERTS - 1)
        route_w = tl.where(jmask, tl.load(weight_ptr + pairs).to(tl.float32), 0.0)
        w_rows = w_ptr + experts[:, None, None] * stride_we + rows[None, :, None] * stride_wn
        h_rows = h_ptr + pairs[:, None] * stride_ht
        acc = tl.zeros([BLOCK_J, BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            kmask = offs_k < INTER
            a = tl.load(h_rows + offs_k[None, :], mask=kmask[None, :], other=0.0)
            w = tl.load(w_rows + offs_k[None, None, :], mask=kmask[None, None, :], other=0.0)
            acc += w.to(tl.float32) * a.to(tl.float32)[:, None, :]
        part = tl.sum(acc, axis=2)
        if FP8:
            part = part * tl.load(scale_ptr + experts[:, None] * HIDDEN + rows[None, :])
        total = tl.sum(part * route_w[:, None], axis=0)
        tl.store(out_ptr + token * stride_ot + offs_n, total.to(out_ptr.dtype.element_ty),
                 mask=nmask)

    _GATE_UP = TritonLaunch(_decode_gate_up_kernel)
    _DOWN = TritonLaunch(_decode_down_kernel)


def fused_moe_decode(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    tiles: tuple[DecodeTile, DecodeTile] = (DecodeTile(), DecodeTile(block_n=8)),
) -> torch.Tensor:
    """``moe.fused_moe`` for contiguous experts ``gate_up [E, 2I, H]``, ``down [E, H, I]`` and
    ``x [T, H]`` (same arguments), in two launches."""
    if triton is None:
        raise ImportError("fused_moe_decode needs triton")
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = gate_up.shape
    inter = two_inter // 2
    top_k = ids.shape[1]
    out = torch.empty_like(x)
    if num_tokens == 0:
        return out
    x = x.contiguous()
    ids = ids.contiguous()
    fp8 = scales is not None
    gate_up_scale, down_scale = scales if fp8 else (x, x)  # unused without FP8
    gu, dn = tiles
    h = torch.empty((num_tokens * top_k, inter), dtype=x.dtype, device=x.device)
    _GATE_UP(
        (num_tokens * top_k, triton.cdiv(inter, gu.block_n)),
        (x, gate_up, ids, gate_up_scale, h, x.stride(0), gate_up.stride(0), gate_up.stride(1),
         h.stride(0)),
        TOP_K=top_k, NUM_EXPERTS=num_experts, HIDDEN=hidden, INTER=inter, BLOCK_N=gu.block_n,
        BLOCK_K=min(gu.block_k, next_pow2(hidden)), FP8=fp8, num_warps=gu.num_warps,
        num_stages=gu.num_stages,
    )  # fmt: skip
    route = weights.contiguous()
    _DOWN(
        (num_tokens, triton.cdiv(hidden, dn.block_n)),
        (h, down, ids, route, down_scale, out, h.stride(0), down.stride(0), down.stride(1),
         out.stride(0)),
        TOP_K=top_k, NUM_EXPERTS=num_experts, HIDDEN=hidden, INTER=inter,
        BLOCK_J=next_pow2(top_k), BLOCK_N=dn.block_n, BLOCK_K=min(dn.block_k, next_pow2(inter)),
        FP8=fp8, num_warps=dn.num_warps,
        num_stages=dn.num_stages,
    )  # fmt: skip
    return out
