"""The Triton kernels behind ``cadence.model.fp8`` (CUDA only): per-token FP8 quantization of
activations, and the weight-only GEMM of few rows (FP8 weight, activations in the model dtype).

Importing this module without Triton defines the wrappers, which then raise on use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cadence.model.skinny_gemm_kernels import MAX_COUNTERS, arrival_counters
from cadence.runtime.triton_launch import TritonLaunch, next_pow2

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None

__all__ = ["WeightOnlyConfig", "quantize_tokens", "weight_only_linear"]

_quant_kernel = _weight_only_kernel = _weight_only_loop = None

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
    def _weight_only_loop(
        acc, x_rows, w_rows, mmask, nmask, offs_k, k_start, k_end,
        BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr, F16: tl.constexpr,
        STAGES: tl.constexpr,
    ):
        """acc + x[:, k_start:k_end] @ w[:, k_start:k_end].T; with F16 the products take
        both operands in f16 (e4m3 -> f16 is one conversion per two weights, while bf16 takes
        a detour through float32): the caller makes sure x fits f16's range. STAGES None
        pipelines the loop as the launch's num_stages says."""
        for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=STAGES):
            kk = k0 + offs_k
            if EVEN_K:
                x = tl.load(x_rows + kk[None, :], mask=mmask[:, None], other=0.0)
                w = tl.load(w_rows + kk[None, :], mask=nmask[:, None], other=0.0)
            else:
                kmask = kk < k_end
                x = tl.load(x_rows + kk[None, :], mask=mmask[:, None] & kmask[None, :],
                            other=0.0)
                w = tl.load(w_rows + kk[None, :], mask=nmask[:, None] & kmask[None, :],
                            other=0.0)
            if IEEE:
                acc += tl.dot(x, tl.trans(w.to(x.dtype)), input_precision="ieee")
            elif F16:
                acc += tl.dot(x.to(tl.float16), tl.trans(w.to(tl.float16)))
            else:
                acc += tl.dot(x, tl.trans(w.to(x.dtype)))
        return acc

    @triton.jit
    def _weight_only_kernel(
        x_ptr, w_ptr, s_ptr, out_ptr, ws_ptr, count_ptr, M, N, K, stride_x, stride_w, stride_o,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr, F16: tl.constexpr,
    ):
        # Program (n, s) multiplies BLOCK_N output channels by the s-th of SPLIT_K runs of K,
        # for all (<= BLOCK_M) rows: the weight is read once, the activations (a few KB) from
        # L2. With SPLIT_K > 1 each program leaves its partial sums in the workspace and the
        # last of a column block to finish adds them up in split order (deterministic), then
        # re-arms the block's counter for the next launch.
        pid_n = tl.program_id(0)
        split = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        mmask = offs_m < M
        nmask = offs_n < N
        x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_x
        w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_w
        per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
        k_start = split * per_split
        k_end = tl.minimum(k_start + per_split, K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        # NOTE: an activation past f16's range (65504) is +-inf in f16, and makes every sum of
        # products with it inf or NaN (0 * inf included): a program whose f16 sums are not all
        # finite does its slice again in the model dtype (as a NaN or inf in x itself does).
        # That loop is not pipelined: pipelined, it cost up to 30% at one row (run AW).
        acc = _weight_only_loop(acc, x_rows, w_rows, mmask, nmask, offs_k, k_start, k_end,
                                BLOCK_K, EVEN_K, IEEE, F16, None)
        if F16:
            finite = (acc == acc) & (tl.abs(acc) < float("inf"))
            if tl.sum(tl.sum(tl.where(finite, 0, 1), 1), 0) > 0:
                acc = _weight_only_loop(tl.zeros([BLOCK_M, BLOCK_N], tl.float32), x_rows,
                                        w_rows, mmask, nmask, offs_k, k_start, k_end, BLOCK_K,
                                        EVEN_K, IEEE, False, 1)
        omask = mmask[:, None] & nmask[None, :]
        if SPLIT_K > 1:
            tile = offs_m[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            part = ws_ptr + (pid_n * SPLIT_K).to(tl.int64) * BLOCK_M * BLOCK_N
            tl.store(part + split * BLOCK_M * BLOCK_N + tile, acc, mask=omask)
            # NOTE: every thread's partial sums are written before the (gpu-scope, release)
            # count; the last program reads them past L1 (.cg), which may hold stale lines.
            tl.debug_barrier()
            done = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if done == SPLIT_K - 1:
                acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                for s in range(SPLIT_K):
                    acc += tl.load(part + s * BLOCK_M * BLOCK_N + tile, mask=omask, other=0.0,
                                   cache_modifier=".cg")
                scale = tl.load(s_ptr + offs_n, mask=nmask, other=0.0)
                tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_o + offs_n[None, :],
                         (acc * scale[None, :]).to(out_ptr.dtype.element_ty), mask=omask)
                tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")
        else:
            scale = tl.load(s_ptr + offs_n, mask=nmask, other=0.0)
            tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_o + offs_n[None, :],
                     (acc * scale[None, :]).to(out_ptr.dtype.element_ty), mask=omask)

    @triton.jit
    def _gemv_kernel(
        x_ptr, w_ptr, s_ptr, out_ptr, ws_ptr, count_ptr, N, K,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
        EVEN_K: tl.constexpr,
    ):
        # One row (batch-1 decode) on the CUDA cores: each program multiplies BLOCK_N channels
        # by its run of K with wide loads and elementwise FMAs, reducing once at the end;
        # split-K partial sums combine as in _weight_only_kernel.
        pid_n = tl.program_id(0)
        split = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        nmask = offs_n < N
        w_rows = w_ptr + offs_n[:, None].to(tl.int64) * K
        per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
        k_start = split * per_split
        k_end = tl.minimum(k_start + per_split, K)
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            kk = k0 + offs_k
            if EVEN_K:
                x = tl.load(x_ptr + kk).to(tl.float32)
                w = tl.load(w_rows + kk[None, :], mask=nmask[:, None], other=0.0)
            else:
                kmask = kk < k_end
                x = tl.load(x_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
                w = tl.load(w_rows + kk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            acc += w.to(tl.float32) * x[None, :]
        total = tl.sum(acc, 1)
        if SPLIT_K > 1:
            lanes = tl.arange(0, BLOCK_N)
            part = ws_ptr + (pid_n * SPLIT_K).to(tl.int64) * BLOCK_N
            tl.store(part + split * BLOCK_N + lanes, total)
            # NOTE: as in _weight_only_kernel: partial sums before the release, .cg reads after.
            tl.debug_barrier()
            done = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if done == SPLIT_K - 1:
                total = tl.zeros([BLOCK_N], tl.float32)
                for s in range(SPLIT_K):
                    total += tl.load(part + s * BLOCK_N + lanes, cache_modifier=".cg")
                scale = tl.load(s_ptr + offs_n, mask=nmask, other=0.0)
                tl.store(out_ptr + offs_n, (total * scale).to(out_ptr.dtype.element_ty),
                         mask=nmask)
                tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")
        else:
            scale = tl.load(s_ptr + offs_n, mask=nmask, other=0.0)
            tl.store(out_ptr + offs_n, (total * scale).to(out_ptr.dtype.element_ty), mask=nmask)

    _GEMV = TritonLaunch(_gemv_kernel)
    _QUANT = TritonLaunch(_quant_kernel)
    _WEIGHT_ONLY = TritonLaunch(_weight_only_kernel)


@dataclass(frozen=True)
class WeightOnlyConfig:
    block_n: int = 32
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    gemv: bool = False  # one row on the CUDA cores (_gemv_kernel) instead of the tensor cores
    f16: bool = False  # tensor-core products in f16 where the activations fit its range


# Measured per (N, K) on the H200 for 16 rows (scripts/fp8_sweep.py --f16, docs/perf.md): the
# f16 tiles beat the bf16 ones on every shape (Llama-3-8B 12.9 / 10.2 / 41.1 / 23.7 us ->
# 10.8 / 8.7 / 32.4 / 19.3 for qkv / o / gate_up / down). Other shapes take _DEFAULT_CONFIG.
WEIGHT_ONLY_CONFIGS: dict[tuple[int, int], WeightOnlyConfig] = {
    (6144, 4096): WeightOnlyConfig(64, 256, 4, 3, 4, f16=True),  # Llama-3-8B
    (4096, 4096): WeightOnlyConfig(64, 256, 4, 3, 4, f16=True),
    (28672, 4096): WeightOnlyConfig(128, 256, 4, 3, 1, f16=True),
    (4096, 14336): WeightOnlyConfig(64, 256, 4, 3, 4, f16=True),
    (4096, 1024): WeightOnlyConfig(32, 256, 4, 3, 1, f16=True),  # Qwen3-0.6B
    (1024, 2048): WeightOnlyConfig(32, 128, 4, 3, 8, f16=True),
    (6144, 1024): WeightOnlyConfig(64, 256, 4, 3, 1, f16=True),
    (1024, 3072): WeightOnlyConfig(32, 128, 4, 3, 8, f16=True),
}
# One row (batch-1 decode), measured per shape: the f16 tiles where they win (Llama-3-8B qkv
# 10.9 -> 10.1 us, gate_up 37.4 -> 30.7, down 20.9 -> 18.5 against the CUDA-core kernel),
# the CUDA-core kernel for Llama-3-8B's o (8.2 us against 8.4).
GEMV_CONFIGS: dict[tuple[int, int], WeightOnlyConfig] = {
    (6144, 4096): WeightOnlyConfig(128, 128, 4, 3, 8, f16=True),
    (4096, 4096): WeightOnlyConfig(16, 1024, 8, 3, 1, True),
    (28672, 4096): WeightOnlyConfig(128, 256, 4, 3, 1, f16=True),
    (4096, 14336): WeightOnlyConfig(128, 128, 4, 3, 8, f16=True),
    (4096, 1024): WeightOnlyConfig(32, 256, 4, 3, 1, f16=True),
    (1024, 2048): WeightOnlyConfig(64, 128, 4, 3, 8, f16=True),
    (6144, 1024): WeightOnlyConfig(64, 256, 4, 3, 1, f16=True),
    (1024, 3072): WeightOnlyConfig(64, 128, 4, 3, 8, f16=True),
}
_DEFAULT_CONFIG = WeightOnlyConfig(32, 256, 4, 3, 1, f16=True)
# float32 activations (tests) double the tiles' shared memory: a small tile fits every shape.
_FLOAT32_CONFIG = WeightOnlyConfig(32, 128, 4, 2)


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
    if m > 16:
        raise ValueError(f"weight_only_linear takes at most 16 rows, got {m}")
    if config is not None:
        cfg = config
    elif x.dtype == torch.float32:
        cfg = _FLOAT32_CONFIG
    elif m == 1 and (n, k) in GEMV_CONFIGS:
        cfg = GEMV_CONFIGS[(n, k)]
    else:
        cfg = WEIGHT_ONLY_CONFIGS.get((n, k), _DEFAULT_CONFIG)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    blocks = triton.cdiv(n, cfg.block_n)
    split = cfg.split_k if blocks <= MAX_COUNTERS else 1
    if split > 1:
        workspace = torch.empty(blocks * split * 16 * cfg.block_n, dtype=torch.float32,
                                device=x.device)
        counters = arrival_counters(x.device)
    else:
        workspace = counters = out  # unused
    if m == 1 and cfg.gemv and weight.stride(0) == k:
        _GEMV((blocks, split), (x, weight, scale, out, workspace, counters, n, k),
              BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split,
              EVEN_K=k % cfg.block_k == 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    elif m:
        _WEIGHT_ONLY(
            (blocks, split),
            (x, weight, scale, out, workspace, counters, m, n, k, x.stride(0), weight.stride(0),
             out.stride(0)),
            BLOCK_M=16, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split,
            EVEN_K=k % cfg.block_k == 0, IEEE=x.dtype == torch.float32,
            F16=cfg.f16 and x.dtype != torch.float32, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return out
