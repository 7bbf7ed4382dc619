"""The Triton kernels behind ``moe``: the two grouped GEMMs of a mixture-of-experts MLP.

Each program takes ``BLOCK_M`` (token, expert) pairs of one expert, in the order
``moe.group_by_expert`` lays them out, and one ``BLOCK_N`` slice of the output features.
Launch them through ``cadence.model.moe``. Importing this module without Triton defines nothing.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None

_moe_gate_up_kernel = _moe_down_kernel = None

if triton is not None:

    @triton.jit
    def _moe_gate_up_kernel(
        x_ptr,
        w_ptr,
        out_ptr,
        sorted_ptr,
        block_expert_ptr,
        num_pairs,
        stride_xt,
        stride_we,
        stride_wn,
        stride_ot,
        TOP_K: tl.constexpr,
        HIDDEN: tl.constexpr,
        INTER: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        """out[pair] = silu(x[token] @ gate[e].T) * (x[token] @ up[e].T), one slice of INTER."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        if expert < 0:
            return  # a block past the last expert's pairs
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_ptr + offs_m).to(tl.int64)
        pmask = pair < num_pairs  # padding entries hold num_pairs
        token = tl.where(pmask, pair // TOP_K, 0)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < INTER
        w_base = w_ptr + expert * stride_we
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, HIDDEN, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            kmask = offs_k < HIDDEN
            a = tl.load(
                x_ptr + token[:, None] * stride_xt + offs_k[None, :],
                mask=pmask[:, None] & kmask[None, :],
                other=0.0,
            )
            wmask = kmask[:, None] & nmask[None, :]
            wg = tl.load(
                w_base + offs_n[None, :] * stride_wn + offs_k[:, None], mask=wmask, other=0.0
            )
            wu = tl.load(
                w_base + (INTER + offs_n[None, :]) * stride_wn + offs_k[:, None],
                mask=wmask,
                other=0.0,
            )
            if IEEE:
                acc_g += tl.dot(a, wg, input_precision="ieee")
                acc_u += tl.dot(a, wu, input_precision="ieee")
            else:
                acc_g += tl.dot(a, wg)
                acc_u += tl.dot(a, wu)
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        tl.store(
            out_ptr + pair[:, None] * stride_ot + offs_n[None, :],
            h.to(out_ptr.dtype.element_ty),
            mask=pmask[:, None] & nmask[None, :],
        )

    @triton.jit
    def _moe_down_kernel(
        h_ptr,
        w_ptr,
        out_ptr,
        sorted_ptr,
        block_expert_ptr,
        weight_ptr,
        num_pairs,
        stride_ht,
        stride_we,
        stride_wn,
        stride_ot,
        HIDDEN: tl.constexpr,
        INTER: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        """out[pair] = routing_weight[pair] * (h[pair] @ down[e].T), one slice of HIDDEN."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        if expert < 0:
            return
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_ptr + offs_m).to(tl.int64)
        pmask = pair < num_pairs
        safe = tl.where(pmask, pair, 0)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < HIDDEN
        w_base = w_ptr + expert * stride_we
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            kmask = offs_k < INTER
            a = tl.load(
                h_ptr + safe[:, None] * stride_ht + offs_k[None, :],
                mask=pmask[:, None] & kmask[None, :],
                other=0.0,
            )
            w = tl.load(
                w_base + offs_n[None, :] * stride_wn + offs_k[:, None],
                mask=kmask[:, None] & nmask[None, :],
                other=0.0,
            )
            if IEEE:
                acc += tl.dot(a, w, input_precision="ieee")
            else:
                acc += tl.dot(a, w)
        route = tl.load(weight_ptr + safe, mask=pmask, other=0.0).to(tl.float32)
        tl.store(
            out_ptr + safe[:, None] * stride_ot + offs_n[None, :],
            (acc * route[:, None]).to(out_ptr.dtype.element_ty),
            mask=pmask[:, None] & nmask[None, :],
        )
