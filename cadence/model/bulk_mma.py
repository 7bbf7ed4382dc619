"""Projections of up to 8 rows through the tensor-core bulk GEMM (``bulk_mma_kernel``): the
weight, bfloat16 or e4m3 with a float32 scale per output row, streamed through shared memory by
``cp.async.bulk`` copies that start before the kernel waits for the one before it, with the
decoder's (residual add +) RMSNorm or SwiGLU applied to the input rows in the same launch.

``bulk_mma(x, weight, cfg, glu=..., scale=...)`` and ``bulk_mma_norm(x, residual, norm_weight,
eps, weight, cfg, scale=...)`` are the launches; ``mma_config`` picks the configuration of a
call from ``MMA_CONFIGS`` (per weight shape, mode, weight type and row bucket, measured on an
H200 by ``scripts/bulk_gemv_bench.py --mma``) and checks the operands (CUDA, compute capability
9.0+, NVRTC, bfloat16 rows, contiguous and 16-byte aligned, K a multiple of 32, or 64 for e4m3;
the norm needs K >= 512; the rows and a stage must fit in shared memory). Off with
``CADENCE_DISABLE_BULK_GEMV=1``, as the one-row kernel.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from cadence.model.bulk_gemv import (
    ENABLED,
    MAX_SHARED,
    TABLE_CAPABILITY,
    BulkConfig,
    blocks_for,
    bulk_config,
    bulk_listed,
    compiled,
    launch,
    nvrtc_ok,
)
from cadence.model.bulk_mma_kernel import KERNEL, MAX_M, NORM_LANES, SOURCE, defines, shared_bytes
from cadence.model.capability import device_capability
from cadence.model.skinny_gemm_kernels import _norm_fits

__all__ = ["MAX_M", "MMA_CONFIGS", "MmaConfig", "bulk_mma", "bulk_mma_norm", "bulk_plan",
           "bulk_plan_listed", "mma_applies", "mma_bucket", "mma_config", "mma_listed"]

FP8 = torch.float8_e4m3fn
_MODES = {"plain": 0, "norm": 1, "glu": 2}


@dataclass(frozen=True)
class MmaConfig:
    """A stage of ``rows`` weight rows (16 or 32) by ``kc`` columns, ``stages`` of them in the
    ring, ``threads`` per block (one block per SM); ``padded`` stage rows (one copy per row, no
    bank conflicts) or not (a stage of whole rows is one contiguous copy)."""

    rows: int = 16
    kc: int = 1024
    stages: int = 3
    threads: int = 256
    padded: bool = True

    def __post_init__(self) -> None:
        if self.threads not in (128, 256, 512):
            raise ValueError(f"threads must be 128, 256 or 512, got {self.threads}")
        if self.rows not in (16, 32) or self.rows * MAX_M > self.threads:
            raise ValueError(f"rows must be 16 or 32 (and at most threads / {MAX_M}), "
                             f"got {self.rows} with {self.threads} threads")
        if self.kc < 64 or self.kc % 64:
            raise ValueError(f"kc must be a positive multiple of 64, got {self.kc}")
        if not 1 <= self.stages <= 8:
            raise ValueError(f"stages must be 1 to 8, got {self.stages}")

    def shared_bytes(self, m: int, k: int, fp8: bool) -> int:
        return shared_bytes(m, k, self.rows, self.kc, self.stages, self.threads, fp8,
                            self.padded)


def mma_bucket(rows: int) -> int:
    """The table's row bucket of ``rows`` (1 to MAX_M): 1, 2, 4 or 8."""
    return 1 if rows <= 1 else 2 if rows == 2 else 4 if rows <= 4 else MAX_M


# (N, K, mode, weight type, row bucket) -> the configuration, for the shapes and row counts where
# the kernel beat the projection's other kernels (scripts/bulk_mma_bench.py --quick, an H100; us
# a call in a graph against the skinny GEMM at 2-4 rows, cuBLAS / the K-split product at 8, and
# at 8 rows SwiGLU before down as its own kernel). In the decode step decode attention loads
# ahead of the qkv kernel's release (attention_tiles.decode_config): Qwen3-0.6B at batch 2 1.22
# -> 0.99-1.01 ms, batch 4 1.25 -> 1.04-1.06, batch 8 1.27 -> 1.16 (at 8 rows the four lose as an
# isolated chain, 36.4 against 31.7 us a layer, and win in the step; docs/perf.md, runs VA-VD).
# Entries marked * are the H200's sweep (run WC; its us): batch 2 0.932-0.936 -> 0.910-0.915 ms,
# batch 4 0.974-0.994 -> 0.962-0.972 there.
MMA_CONFIGS: dict[tuple[int, int, str, str, int], MmaConfig] = {
    (1024, 2048, "plain", "bf16", 2): MmaConfig(16, 2048, 1, 256, True),  # o: 2.93 vs 5.14
    (1024, 2048, "plain", "bf16", 4): MmaConfig(16, 2048, 1, 256, True),  # o: 2.90 vs 5.17
    (1024, 3072, "glu", "bf16", 2): MmaConfig(16, 3072, 2, 256, True),  # down: 5.80 vs 6.93
    (4096, 1024, "norm", "bf16", 2): MmaConfig(32, 1024, 1, 256, True),  # qkv: 4.36 vs 7.48
    (4096, 1024, "norm", "bf16", 4): MmaConfig(32, 1024, 1, 256, True),  # qkv: 4.51 vs 7.00 *
    (6144, 1024, "norm", "bf16", 2): MmaConfig(16, 1024, 3, 256, True),  # gate_up: 5.01 vs 7.72 *
    (6144, 1024, "norm", "bf16", 4): MmaConfig(16, 1024, 2, 256, True),  # gate_up: 7.49 vs 8.87
    (1024, 2048, "plain", "bf16", 8): MmaConfig(16, 2048, 1, 256, True),  # o: 3.01 vs 4.77 *
    (1024, 3072, "plain", "bf16", 8): MmaConfig(16, 3072, 1, 256, True),  # down: 7.38 vs 8.02
    (4096, 1024, "norm", "bf16", 8): MmaConfig(32, 1024, 1, 256, True),  # qkv: 6.55 vs 7.65
    (6144, 1024, "norm", "bf16", 8): MmaConfig(16, 1024, 2, 256, True),  # gate_up: 8.44 vs 8.93
}


def _weight_type(weight: torch.Tensor) -> str | None:
    return "fp8" if weight.dtype == FP8 else "bf16" if weight.dtype == torch.bfloat16 else None


def mma_applies(x: torch.Tensor, weight: torch.Tensor, cfg: MmaConfig, mode: str = "plain",
                scale: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                norm_weight: torch.Tensor | None = None) -> bool:
    """Whether the kernel takes this call (see the module docstring): ``x`` [M <= 8, K] (or
    [M, 2K] for "glu") in bfloat16; ``weight`` [N, K] bfloat16, or e4m3 with ``scale`` [N]
    float32; "norm" also checks ``residual`` (None, or x's shape and dtype) and
    ``norm_weight``."""
    wtype = _weight_type(weight)
    if wtype is None or not (x.is_cuda and weight.is_cuda and x.dtype == torch.bfloat16):
        return False
    fp8 = wtype == "fp8"
    n, k = weight.shape
    width = 2 * k if mode == "glu" else k
    if x.dim() != 2 or x.shape[1] != width or not 1 <= x.shape[0] <= MAX_M or n == 0:
        return False
    if k % (64 if fp8 else 32) or not (x.is_contiguous() and weight.is_contiguous()):
        return False
    if (x.data_ptr() | weight.data_ptr()) & 15 or cfg.shared_bytes(x.shape[0], k, fp8) > MAX_SHARED:
        return False
    if fp8 and not (scale is not None and scale.dtype == torch.float32 and scale.shape == (n,)
                    and scale.is_contiguous() and scale.device == weight.device):
        return False
    if mode == "norm":
        if k < NORM_LANES or norm_weight is None or not _norm_fits(x, residual, norm_weight, k):
            return False
        if norm_weight.data_ptr() & 15 or norm_weight.device != x.device:
            return False
        if residual is not None and (residual.device != x.device or residual.data_ptr() & 15):
            return False
    return device_capability(x.device) >= (9, 0) and nvrtc_ok()


def mma_listed(weight: torch.Tensor, mode: str, rows: int) -> bool:
    """Whether calls of ``rows`` rows on this weight in ``mode`` take the kernel on its device
    (the table lists them; the call's operands are checked by ``mma_config``)."""
    wtype = _weight_type(weight)
    return (ENABLED and wtype is not None and weight.is_cuda and weight.dim() == 2
            and 1 <= rows <= MAX_M
            and (*weight.shape, mode, wtype, mma_bucket(rows)) in MMA_CONFIGS
            and device_capability(weight.device) == TABLE_CAPABILITY and nvrtc_ok())


def mma_config(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, mode: str,
               scale: torch.Tensor | None = None, residual: torch.Tensor | None = None,
               norm_weight: torch.Tensor | None = None) -> MmaConfig | None:
    """The configuration a call takes, or None where it keeps its other kernels: the table
    lists it on this device, no bias, no autograd, and ``mma_applies``."""
    rows = x.shape[0] if x.dim() == 2 else 0
    if bias is not None or not mma_listed(weight, mode, rows):
        return None
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x, weight, residual, norm_weight)):
        return None
    cfg = MMA_CONFIGS[(*weight.shape, mode, _weight_type(weight), mma_bucket(rows))]
    return cfg if mma_applies(x, weight, cfg, mode, scale, residual, norm_weight) else None


def bulk_plan_listed(weight: torch.Tensor, mode: str, rows: int) -> bool:
    """Whether a table lists calls of ``rows`` rows on this weight in ``mode``: this kernel's
    for the row count, or for one row ``bulk_gemv``'s (``bulk_plan`` checks the operands)."""
    return mma_listed(weight, mode, rows) or (rows == 1 and bulk_listed(weight, mode))


def bulk_plan(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, mode: str,
              scale: torch.Tensor | None = None, residual: torch.Tensor | None = None,
              norm_weight: torch.Tensor | None = None) -> MmaConfig | BulkConfig | None:
    """The bulk kernel a call of ``x`` [rows, width] takes, if any: this one where its table
    lists the row count (it measured faster there), else for one row the GEMV's; ``scale``:
    an e4m3 weight's row scales."""
    mma = mma_config(x, weight, bias, mode, scale, residual, norm_weight)
    if mma is not None or x.shape[0] != 1:
        return mma
    return bulk_config(x, weight, bias, mode, residual, norm_weight, scale)


def _run(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, cfg: MmaConfig,
         mode: str, residual: torch.Tensor | None, norm_weight: torch.Tensor | None,
         eps: float, out: torch.Tensor, res_out: torch.Tensor | None) -> None:
    n, k = weight.shape
    m = x.shape[0]
    fp8 = weight.dtype == FP8
    options = defines(cfg.rows, cfg.kc, cfg.stages, cfg.threads, _MODES[mode],
                      residual is not None, fp8, cfg.padded, mma_bucket(m))
    kernel = compiled(x.get_device(), SOURCE, KERNEL, options)
    args = (weight, x if scale is None else scale, x, x if residual is None else residual,
            x if norm_weight is None else norm_weight, out, out if res_out is None else res_out,
            ctypes.c_int32(m), ctypes.c_int32(n), ctypes.c_int32(k), ctypes.c_float(eps))
    launch(kernel, blocks_for(x.device, n), cfg.threads, cfg.shared_bytes(m, k, fp8), x.device,
           args)


def bulk_mma(x: torch.Tensor, weight: torch.Tensor, cfg: MmaConfig, glu: bool = False,
             scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (weight * scale[:, None]).T`` ([M, N] bfloat16; no scale for a bfloat16 weight)
    for ``x`` [M, K]; with ``glu`` x is [M, 2K], gate then up, and the product is taken of
    ``silu_and_mul(x)``. The caller checks ``mma_applies``."""
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    _run(x, weight, scale, cfg, "glu" if glu else "plain", None, None, 0.0, out, None)
    return out


def bulk_mma_norm(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                  eps: float, weight: torch.Tensor, cfg: MmaConfig,
                  scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(bulk_mma(h, weight, cfg, scale=scale), s)`` for ``h, s = add_rms_norm(x, residual,
    norm_weight, eps)`` (``rms_norm`` and ``s = x`` without a residual): one launch, ``h``
    with the RMSNorm kernel's bits. ``mma_applies(x, weight, cfg, "norm", ...)`` holds."""
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    res_out = x if residual is None else torch.empty_like(x)
    _run(x, weight, scale, cfg, "norm", residual, norm_weight, eps, out,
         None if residual is None else res_out)
    return out, res_out
