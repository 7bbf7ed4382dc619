"""The Triton kernels behind ``cadence.model.fp8`` (CUDA only): per-token FP8 quantization of
activations, and the weight-only GEMM of few rows (FP8 weight, activations in the model dtype).

Importing this module without Triton defines the wrappers, which then raise on use.
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

__all__ = ["WeightOnlyConfig", "quantize_tokens", "weight_only_linear"]

_quant_kernel = _weight_only_kernel = None

if triton is not None:

    @triton.jit
    def _quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < K
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), 0), 1e-12) / 448.0
        q = tl.minimum(tl.maximum(x / scale, -448.0), 448.0)
        tl.store(q_ptr + row * K + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(s_ptr + row, scale)

    @triton.jit
    def _weight_only_kernel(
        x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_x, stride_w, stride_o,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr, IEEE: tl.constexpr,
    ):
        # One program per BLOCK_N output channels and all (<= BLOCK_M) rows: the weight is read
        # once, the activations (a few KB) from L2.
        pid = tl.program_id(0)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        mmask = offs_m < M
        nmask = offs_n < N
        x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_x
        w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_w
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            if EVEN_K:
                x = tl.load(x_rows + kk[None, :], mask=mmask[:, None], other=0.0)
                w = tl.load(w_rows + kk[None, :], mask=nmask[:, None], other=0.0)
            else:
                kmask = kk < K
                x = tl.load(x_rows + kk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
                w = tl.load(w_rows + kk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            if IEEE:
                acc += tl.dot(x, tl.trans(w.to(x.dtype)), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w.to(x.dtype)))
        scale = tl.load(s_ptr + offs_n, mask=nmask, other=0.0)
        out = acc * scale[None, :]
        tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_o + offs_n[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])

    _QUANT = TritonLaunch(_quant_kernel)
    _WEIGHT_ONLY = TritonLaunch(_weight_only_kernel)


@dataclass(frozen=True)
class WeightOnlyConfig:
    block_n: int = 32
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4


# Measured per (N, K) on the H200 (scripts/fp8_sweep.py); other shapes take the default.
WEIGHT_ONLY_CONFIGS: dict[tuple[int, int], WeightOnlyConfig] = {}


def _require_triton() -> None:
    if triton is None:
        raise ImportError("FP8 on CUDA needs triton (shipped with torch's CUDA builds)")


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: each row of ``x`` [M, K] in e4m3 with a float32 scale of its own
    (``amax / 448``), as ``cadence.model.fp8.quantize_rows`` defines them."""
    _require_triton()
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        block = next_pow2(k, 16)
        _QUANT((m,), (x, q, scale, k, x.stride(0)), BLOCK=block,
               num_warps=max(1, min(16, block // 256)))
    return q, scale


def weight_only_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                       config: WeightOnlyConfig | None = None) -> torch.Tensor:
    """``x @ (weight * scale[:, None]).T`` for ``x`` [M <= 16, K] in the model dtype, ``weight``
    [N, K] in e4m3, ``scale`` [N] float32; the result in x's dtype."""
    _require_triton()
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    cfg = config or WEIGHT_ONLY_CONFIGS.get((n, k)) or WeightOnlyConfig()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m:
        _WEIGHT_ONLY(
            (triton.cdiv(n, cfg.block_n),),
            (x, weight, scale, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0)),
            BLOCK_M=16, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=k % cfg.block_k == 0,
            IEEE=x.dtype == torch.float32,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    return out
