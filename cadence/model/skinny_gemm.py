"""Skinny GEMMs for decode: the decoder's projections of up to 16 rows through a split-K Triton
kernel (``skinny_gemm_kernels``) that streams the weight on every SM, where it beats cuBLAS.

``skinny_linear(x, weight, bias)`` is ``F.linear`` with that dispatch: the kernel runs for CUDA
tensors in bfloat16 / float16 (x, weight and bias of one dtype, contiguous), at most
``MAX_ROWS`` rows, on compute capability 8.0 or newer, and only where the configuration table
(``SKINNY_CONFIGS``, measured per shape and row count by ``scripts/skinny_gemm_sweep.py``) or,
for smaller weights it does not list, ``heuristic_config`` gives a configuration; the rest is
``F.linear`` unchanged (the CPU path above all). ``SkinnyLinear`` is an ``nn.Linear`` whose
forward is ``skinny_linear``; ``use_skinny_gemm(model)`` turns the decoder's projections into
one. ``CADENCE_DISABLE_SKINNY_GEMM=1`` leaves every projection to ``F.linear``;
``CADENCE_DISABLE_SKINNY_GLU=1`` keeps SwiGLU a kernel of its own before the down projection;
``CADENCE_DISABLE_FUSED_NORM=1`` keeps the decoder's (residual add +) RMSNorm a kernel of its own
before the qkv and gate_up projections (``SkinnyLinear.forward_norm``).

The first call of a configuration compiles it, so the first call on a device (which also
allocates the kernel's counters) must run outside a CUDA graph capture, as warm-ups do; a
call under capture before that takes ``F.linear``.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from cadence.envs import read_envs
from cadence.model.bulk_gemv import BulkConfig, bulk_gemv, bulk_gemv_norm, bulk_listed
from cadence.model.bulk_mma import MmaConfig, bulk_mma, bulk_mma_norm, bulk_plan, mma_listed
from cadence.model.fused_ops import norm_and_project, silu_and_mul
from cadence.model.skinny_gemm_kernels import (
    SkinnyConfig,
    SkinnyPlan,
    has_scratch,
    row_bucket,
    skinny_matmul,
    skinny_matmul_norm,
    skinny_plan,
)

__all__ = [
    "MAX_ROWS",
    "SKINNY_CONFIGS",
    "SkinnyConfig",
    "SkinnyLinear",
    "bulk_takes_mlp",
    "heuristic_config",
    "norm_fusion",
    "row_bucket",
    "skinny_linear",
    "use_skinny_gemm",
]

logger = logging.getLogger(__name__)

MAX_ROWS = 16
ENABLED = not read_envs().disable_skinny_gemm
# Up to this many rows SwiGLU runs in the down projection's loads (forward_glu). H200,
# Qwen3-0.6B decode steps, fused against two kernels (same runs): 1 row 1.083-1.090 against
# 1.110-1.112 ms; 2 and 4 rows equal within 0.005 ms (28 launches fewer for eager steps);
# 8 rows 1.267-1.282 against 1.262-1.264 ms.
GLU_MAX_ROWS = 0 if read_envs().disable_skinny_glu else 4
# Up to this many rows, and rows of at most NORM_MAX_K, the decoder's (residual add +) RMSNorm
# runs in the loads of the skinny projection that takes its output (forward_norm): two kernels
# and their gaps fewer per layer, against every program reading its rows whole from L2 before
# its weights. H200, norm + GEMM against the fused launch inside graphs, us: Qwen3-0.6B qkv
# (K 1024) 1 row 6.00 -> 4.88, 2-4 rows 7.0 -> 11.6-11.9; gate_up 1 row 6.99 -> 7.12, 2-4 rows
# 7.7 -> 9.7; Llama-3-8B qkv (K 4096) 1 row 17.55 -> 20.14.
NORM_MAX_ROWS = 0 if read_envs().disable_fused_norm else 1
NORM_MAX_K = 2048
# Past NORM_MAX_K, up to this many bfloat16 rows the norm still runs in the projection, with its
# scale applied after the products (``late_norm``): nothing is read ahead of the weights, at the
# cost of the two kernels' bits (h is not rounded before the products). Not for float16, whose
# range s * w could leave before the scale. Only shapes LATE_NORM_CONFIGS lists take it. H200,
# norm + GEMM against the late launch inside graphs, us: Llama-3-8B qkv 1 row 16.96 -> 16.12,
# gate_up 1 row 60.68 -> 62.66 (not listed); Qwen3-0.6B qkv / gate_up at 4 and 8 rows 7.0-7.7 ->
# 8.9-21.6 (the loads of x, the residual and the norm weight lengthen every K step; tensor-core
# tiles also lose their pipelined x operand), hence one row.
LATE_NORM_MAX_ROWS = 0 if read_envs().disable_fused_norm else 1
# The decoder layers' projections (module names) that use_skinny_gemm converts.
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
_DTYPES = (torch.bfloat16, torch.float16)
_MIN_CAPABILITY = (8, 0)  # bfloat16 tensor-core dots
# The device SKINNY_CONFIGS was measured on; others take heuristic_config for every shape.
TABLE_CAPABILITY = (9, 0)
# Shapes the table does not list (or other devices): heuristic_config up to this many weight
# bytes, cuBLAS above. At one row on the H200 cuBLAS streams Llama-3-8B's 32-235 MB projections
# at 2.5-4.3 TB/s but Qwen3-0.6B's 4-12 MB ones below 1 TB/s, and the FP8 split-K kernel of
# this design reached 1.7-2.9 TB/s (docs/perf.md, run N). 0: cuBLAS for every unlisted shape.
HEURISTIC_MAX_WEIGHT_BYTES = 16 << 20

# (N, K, row bucket) -> the fastest configuration, or None where cuBLAS is faster. Measured on
# an H200 with scripts/skinny_gemm_sweep.py (which prints this dict); the row buckets are those
# of row_bucket.
# (The sweep of 2026-12-01, --quick; Qwen3-0.6B's o_proj at 1, 4 and 8 rows was not recorded:
# it takes heuristic_config.) Comments: the kernel's and cuBLAS's microseconds per call.
SKINNY_CONFIGS: dict[tuple[int, int, int], SkinnyConfig | None] = {
    (1024, 2048, 16): SkinnyConfig(32, 256, 4, 4, 3, True),  # 5.18 vs 5.80
    (1024, 3072, 1): SkinnyConfig(32, 256, 6, 8, 1, False),  # 5.11 vs 7.35
    (1024, 3072, 4): SkinnyConfig(64, 128, 8, 8, 3, True),  # 5.94 vs 7.48
    (1024, 3072, 8): SkinnyConfig(64, 128, 8, 8, 3, True),  # 5.92 vs 7.40
    (1024, 3072, 16): SkinnyConfig(32, 256, 4, 4, 3, True),  # 6.00 vs 7.65
    (4096, 1024, 1): SkinnyConfig(8, 512, 1, 4, 1, False),  # 4.30 vs 5.22
    (4096, 1024, 4): None,  # 5.42 vs 5.21
    (4096, 1024, 8): None,  # 5.44 vs 5.22
    (4096, 1024, 16): None,  # 5.42 vs 5.27
    (4096, 4096, 1): SkinnyConfig(8, 512, 1, 4, 1, False),  # 11.45 vs 13.43
    (4096, 4096, 4): SkinnyConfig(64, 128, 4, 4, 3, True),  # 11.70 vs 13.33
    (4096, 4096, 8): SkinnyConfig(64, 128, 4, 4, 3, True),  # 11.77 vs 13.26
    (4096, 4096, 16): SkinnyConfig(64, 128, 4, 4, 3, True),  # 11.95 vs 13.40
    (4096, 14336, 1): SkinnyConfig(64, 128, 4, 4, 3, True),  # 31.04 vs 32.06
    (4096, 14336, 4): SkinnyConfig(64, 128, 4, 4, 3, True),  # 31.36 vs 32.47
    (4096, 14336, 8): None,  # 31.76 vs 32.56
    (4096, 14336, 16): None,  # 32.05 vs 32.90
    (6144, 1024, 1): SkinnyConfig(8, 512, 1, 4, 1, False),  # 5.29 vs 6.02
    (6144, 1024, 4): None,  # 6.29 vs 5.93
    (6144, 1024, 8): None,  # 6.32 vs 5.91
    (6144, 1024, 16): None,  # 6.34 vs 5.97
    (6144, 4096, 1): SkinnyConfig(8, 512, 1, 4, 1, False),  # 14.71 vs 16.92
    (6144, 4096, 4): None,  # 16.26 vs 15.82
    (6144, 4096, 8): None,  # 16.50 vs 15.96
    (6144, 4096, 16): None,  # 16.83 vs 16.19
    (28672, 4096, 1): None,  # 57.62 vs 57.94
    (28672, 4096, 4): None,  # 58.75 vs 56.96
    (28672, 4096, 8): None,  # 59.06 vs 57.40
    (28672, 4096, 16): None,  # 60.08 vs 57.87
    # Qwen3-30B-A3B's attention projections (sweep of 2026-12-01, rows 1 and 4).
    (5120, 2048, 1): SkinnyConfig(8, 512, 1, 4, 1, False),  # 7.35 vs 8.11
    (5120, 2048, 4): None,  # 8.94 vs 7.95
    (2048, 4096, 1): SkinnyConfig(4, 1024, 1, 4, 1, False),  # 6.72 vs 9.36 (heuristic 8.89)
    (2048, 4096, 4): SkinnyConfig(64, 128, 4, 4, 4, True),  # 7.85 vs 9.40 (heuristic 8.91)
}


def heuristic_config(rows: int, n: int, k: int, num_sms: int) -> SkinnyConfig:
    """A configuration for a shape the table does not list: 32 x 256 tensor-core tiles (the
    FP8 weight-only kernel's measured tile) and enough K slices for about four programs per
    SM. ``rows`` does not change it (the rows are padded to 16)."""
    block_n, block_k = 32, 256
    column_blocks = -(-n // block_n)
    split = max(1, min(-(-4 * num_sms // column_blocks), -(-k // block_k)))
    return SkinnyConfig(block_n, block_k, split, num_warps=4, num_stages=3, dot=True)


# (N, K, row bucket) -> the fused-norm launch's configuration (None: the norm kernel, then the
# projection as SKINNY_CONFIGS has it) on the table's device, measured with the norm in the loads
# by scripts/fused_norm_bench.py --sweep; shapes it does not list take _choose_norm's rule.
NORM_CONFIGS: dict[tuple[int, int, int], SkinnyConfig | None] = {}

# (N, K, row bucket) -> the late norm's configuration on the table's device, measured by
# scripts/fused_norm_bench.py --late (--sweep prints this table); shapes it does not list (and
# other devices) keep the norm kernel.
LATE_NORM_CONFIGS: dict[tuple[int, int, int], SkinnyConfig] = {
    (6144, 4096, 1): SkinnyConfig(16, 512, 1, 4, 1, False),  # 16.12 vs 16.96 us
}

# (device index, N, K, row bucket) -> the configuration in use (None: F.linear).
_CHOSEN: dict[tuple[int | None, int, int, int], SkinnyConfig | None] = {}
_CHOSEN_NORM: dict[tuple[int | None, int, int, int, bool], SkinnyConfig | None] = {}


def _choose(device: torch.device, n: int, k: int, bucket: int) -> SkinnyConfig | None:
    key = (device.index, n, k, bucket)
    if key in _CHOSEN:
        return _CHOSEN[key]
    capability = torch.cuda.get_device_capability(device)
    cfg: SkinnyConfig | None = None
    if capability >= _MIN_CAPABILITY:
        if capability == TABLE_CAPABILITY and (n, k, bucket) in SKINNY_CONFIGS:
            cfg = SKINNY_CONFIGS[(n, k, bucket)]
        elif 2 * n * k <= HEURISTIC_MAX_WEIGHT_BYTES:  # bf16 / fp16
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            cfg = heuristic_config(bucket, n, k, sms)
    _CHOSEN[key] = cfg
    return cfg


def _choose_norm(device: torch.device, n: int, k: int, bucket: int, late: bool = False
                 ) -> SkinnyConfig | None:
    """The configuration of the projection with its input's norm in the loads: NORM_CONFIGS'
    where it lists the shape, else the plain GEMM's where that is the kernel, else (where cuBLAS
    was the faster GEMM: by 0.2-0.4 us at Qwen3-0.6B's qkv and gate_up shapes) heuristic_config
    up to HEURISTIC_MAX_WEIGHT_BYTES, as the fusion saves a norm kernel and its launch gap. With
    ``late``, LATE_NORM_CONFIGS' on the table's device, else None (only measured shapes)."""
    key = (device.index, n, k, bucket)
    if (*key, late) in _CHOSEN_NORM:
        return _CHOSEN_NORM[(*key, late)]
    capability = torch.cuda.get_device_capability(device)
    if late:
        cfg = LATE_NORM_CONFIGS.get((n, k, bucket)) if capability == TABLE_CAPABILITY else None
    elif capability == TABLE_CAPABILITY and (n, k, bucket) in NORM_CONFIGS:
        cfg = NORM_CONFIGS[(n, k, bucket)]
    else:
        cfg = _CHOSEN[key] if key in _CHOSEN else _choose(device, n, k, bucket)
        if cfg is None and capability >= _MIN_CAPABILITY and 2 * n * k <= HEURISTIC_MAX_WEIGHT_BYTES:
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            cfg = heuristic_config(bucket, n, k, sms)
    _CHOSEN_NORM[(*key, late)] = cfg
    return cfg


def _usable(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if x.dtype not in _DTYPES or weight.dtype != x.dtype or not weight.is_cuda:
        return False
    if bias is not None and (bias.dtype != x.dtype or not bias.is_contiguous()):
        return False
    if not (x.is_contiguous() and weight.is_contiguous()):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False  # no backward
    return has_scratch(x.device) or not torch.cuda.is_current_stream_capturing()


def _torch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  glu: bool) -> torch.Tensor:
    """What the kernel stands for, in torch (cuBLAS): the path wherever it does not apply."""
    return F.linear(silu_and_mul(x) if glu else x, weight, bias)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through the skinny kernel where it is faster (see the
    module's docstring); the same result up to the order of the float32 additions. With
    ``glu``, ``F.linear(silu_and_mul(x), weight, bias)``: the kernel applies SwiGLU to ``x``
    (gate | up) as it loads it, with the bits ``silu_and_mul`` would give."""
    width = x.shape[-1]
    k = weight.shape[1]
    rows = x.numel() // width if width else 0
    fits = width == (2 * k if glu else k)  # else F.linear raises the shape error
    if ENABLED and fits and 0 < rows <= MAX_ROWS and x.is_cuda and _usable(x, weight, bias):
        n = weight.shape[0]
        key = (x.device.index, n, k, row_bucket(rows))
        cfg = _CHOSEN[key] if key in _CHOSEN else _choose(x.device, n, k, key[3])
        if cfg is not None:
            try:
                out = skinny_matmul(x.reshape(rows, width), weight, bias, cfg, glu)
            except Exception:  # e.g. a configuration Triton cannot compile here
                logger.warning("skinny GEMM %s for [%d, %d] x [%d, %d] failed; cuBLAS from now on",
                               cfg, rows, k, n, k, exc_info=True)
                _CHOSEN[key] = None
            else:
                return out.view(*x.shape[:-1], n)
    return _torch_linear(x, weight, bias, glu)


def norm_fusion(rows: int, width: int, dtype: torch.dtype) -> str | None:
    """How ``SkinnyLinear.forward_norm`` takes a norm of ``rows`` rows of ``width``: "exact"
    (the two kernels' bits), "late" (the scale after the products) or None (the two calls)."""
    if rows <= 0:
        return None
    if rows <= NORM_MAX_ROWS and width <= NORM_MAX_K:
        return "exact"
    if rows <= LATE_NORM_MAX_ROWS and width > NORM_MAX_K and dtype == torch.bfloat16:
        return "late"
    return None


_NO_PLAN = object()  # not resolved yet
_DISPATCH = object()  # the kernel, but no plan could be made: through skinny_linear each time


class SkinnyLinear(nn.Linear):
    """An ``nn.Linear`` whose forward is ``skinny_linear`` (the same parameters and state).

    Each decode row count's launch is resolved once per module (a ``SkinnyPlan``, or cuBLAS),
    so that an eager step pays for a kernel launch and an allocation, not for the dispatch."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._run(input, False)

    def forward_glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``forward(silu_and_mul(gate_up))`` (the MLP's down projection), SwiGLU fused into
        the skinny kernel's loads up to ``GLU_MAX_ROWS`` rows; the same bits as the two
        calls."""
        rows = gate_up.numel() // gate_up.shape[-1] if gate_up.shape[-1] else 0
        if rows > GLU_MAX_ROWS and not mma_listed(self.weight, "glu", rows):
            return self._run(silu_and_mul(gate_up), False)
        return self._run(gate_up, True)

    def forward_norm(self, x: torch.Tensor, residual: torch.Tensor | None,
                     norm_weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(forward(h), s)`` for ``h, s = add_rms_norm(x, residual, norm_weight, eps)``
        (``h = rms_norm(x, norm_weight, eps)`` and ``s = x`` without a residual): the decoder's
        norm before this projection, in the skinny kernel's loads up to ``NORM_MAX_ROWS`` rows
        of at most ``NORM_MAX_K`` (the bits of the two calls with the same configuration), past
        them as a late norm up to ``LATE_NORM_MAX_ROWS`` bfloat16 rows (within a rounding),
        else the two calls."""
        width = x.shape[-1]
        rows = x.numel() // width if width else 0
        mode = norm_fusion(rows, width, x.dtype)
        if ENABLED and x.is_cuda and (mode is not None or mma_listed(self.weight, "norm", rows)):
            fused = self._run_norm(x, rows, residual, norm_weight, eps, mode == "late",
                                   skinny=mode is not None)
            if fused is not None:
                return fused
        return norm_and_project(self, x, residual, norm_weight, eps)

    def _run_norm(self, x: torch.Tensor, rows: int, residual: torch.Tensor | None,
                  norm_weight: torch.Tensor, eps: float, late: bool = False, skinny: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``forward_norm``'s single launch, or None where it does not apply: the bulk
        kernels where their tables list the call, else (``skinny``) the skinny GEMM's."""
        weight, bias = self.weight, self.bias
        plans = self.__dict__.get("_skinny_plans")
        if plans is None:
            plans = self.__dict__["_skinny_plans"] = {}
        key = ("norm", late, rows, x.dtype, x.get_device(), x.data_ptr() & 15, x.is_contiguous(),
               None if residual is None else (residual.data_ptr() & 15, residual.dtype,
                                              residual.shape, residual.is_contiguous()),
               norm_weight.data_ptr(), norm_weight.dtype, torch.is_grad_enabled(),
               weight.data_ptr(), None if bias is None else bias.data_ptr())
        plan = plans.get(key, _NO_PLAN)
        if plan is None:
            return None
        width, n = x.shape[-1], self.out_features
        x2 = x.reshape(rows, width)
        r2 = None if residual is None else residual.reshape(rows, width)
        if isinstance(plan, SkinnyPlan):
            out, new_residual = plan.with_norm(x2, r2, norm_weight, eps, weight, bias)
            return out.view(*x.shape[:-1], n), new_residual.view(x.shape)
        if plan is _NO_PLAN:
            bulk = bulk_plan(x2, weight, bias, "norm", None, r2, norm_weight)
            if bulk is not None:
                plan = plans[key] = bulk
        if isinstance(plan, MmaConfig):
            out, new_residual = bulk_mma_norm(x2, r2, norm_weight, eps, weight, plan)
            return out.view(*x.shape[:-1], n), new_residual.view(x.shape)
        if isinstance(plan, BulkConfig):
            out, new_residual = bulk_gemv_norm(x2, r2, norm_weight, eps, weight, plan)
            return out.view(*x.shape[:-1], n), new_residual.view(x.shape)
        cfg = self._norm_config(x, residual, norm_weight, rows, late) if skinny else None
        if cfg is None:
            plans[key] = None
            return None
        try:
            out, new_residual = skinny_matmul_norm(x2, r2, norm_weight, eps, weight, bias, cfg,
                                                   late)
        except Exception:  # e.g. a configuration Triton cannot compile here
            logger.warning("skinny GEMM %s with its input's norm for [%d, %d] x [%d, %d] failed;"
                           " the norm kernel from now on", cfg, rows, width, n, width,
                           exc_info=True)
            plans[key] = None
            return None
        if plan is _NO_PLAN and not torch.is_grad_enabled():
            made = skinny_plan(x2, weight, bias, cfg, norm=(r2, norm_weight, eps, late))
            plans[key] = _DISPATCH if made is None else made
        return out.view(*x.shape[:-1], n), new_residual.view(x.shape)

    def _norm_config(self, x: torch.Tensor, residual: torch.Tensor | None,
                     norm_weight: torch.Tensor, rows: int, late: bool = False
                     ) -> SkinnyConfig | None:
        """The fused-norm launch's configuration (``late``: the late norm's, which takes rows
        of any width); None where it does not apply."""
        weight, bias = self.weight, self.bias
        k = weight.shape[1]
        if x.shape[-1] != k or (k > NORM_MAX_K and not late) or rows > MAX_ROWS:
            return None
        if not _usable(x, weight, bias):
            return None
        if norm_weight.shape != (k,) or norm_weight.dtype != x.dtype:
            return None
        if not norm_weight.is_contiguous() or norm_weight.device != x.device:
            return None
        if residual is not None and not (residual.shape == x.shape and residual.dtype == x.dtype
                                         and residual.is_contiguous()):
            return None
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                           for t in (residual, norm_weight)):
            return None  # no backward
        return _choose_norm(x.device, weight.shape[0], k, row_bucket(rows), late)

    def _run(self, input: torch.Tensor, glu: bool) -> torch.Tensor:
        width = input.shape[-1]
        rows = input.numel() // width if width else 0
        weight, bias = self.weight, self.bias
        if rows > MAX_ROWS or not ENABLED:
            return _torch_linear(input, weight, bias, glu)
        plans = self.__dict__.get("_skinny_plans")
        if plans is None:
            plans = self.__dict__["_skinny_plans"] = {}
        # The parameters' pointers are in the key: a weight or bias replaced (not copied into)
        # after planning gets plans of its own.
        key = (rows, width, glu, input.dtype, input.get_device(), input.data_ptr() & 15,
               input.is_contiguous(), torch.is_grad_enabled(), weight.data_ptr(),
               None if bias is None else bias.data_ptr())
        plan = plans.get(key, _NO_PLAN)
        if plan is None:
            return _torch_linear(input, weight, bias, glu)
        if plan is _NO_PLAN:
            bulk = bulk_plan(input.reshape(rows, width), weight, bias, "glu" if glu else "plain")
            if bulk is not None:
                plan = plans[key] = bulk
        if isinstance(plan, MmaConfig):
            return bulk_mma(input.reshape(rows, width), weight, plan, glu).view(
                *input.shape[:-1], self.out_features)
        if isinstance(plan, BulkConfig):
            return bulk_gemv(input.reshape(1, width), weight, plan, glu).view(
                *input.shape[:-1], self.out_features)
        if plan is _DISPATCH:
            return skinny_linear(input, weight, bias, glu)
        if plan is not _NO_PLAN:
            return plan(input, weight, bias).view(*input.shape[:-1], self.out_features)
        out = skinny_linear(input, weight, bias, glu)
        if not torch.is_grad_enabled() and (has_scratch(input.device) or not input.is_cuda):
            plans[key] = self._plan(input, rows, glu)
        return out

    def _plan(self, x: torch.Tensor, rows: int, glu: bool) -> SkinnyPlan | object | None:
        """The plan; None: cuBLAS (as skinny_linear chose); _DISPATCH: the kernel unplanned."""
        if not (ENABLED and x.is_cuda and _usable(x, self.weight, self.bias)):
            return None
        n, k = self.weight.shape
        key = (x.device.index, n, k, row_bucket(rows))
        if key not in _CHOSEN or _CHOSEN[key] is None:
            return None
        plan = skinny_plan(x.reshape(rows, x.shape[-1]), self.weight, self.bias, _CHOSEN[key],
                           glu)
        return _DISPATCH if plan is None else plan

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        self.__dict__.pop("_skinny_plans", None)  # .to(), .half(), ...: new parameters
        return super()._apply(fn, recurse)


def bulk_takes_mlp(o_proj: nn.Module, gate_up_proj: nn.Module, down_proj: nn.Module) -> bool:
    """Whether a one-token step's o_proj, post-attention norm + gate_up and SwiGLU + down all run
    as bulk-copy GEMVs (``bulk_gemv``), which measured faster than the MLP block."""
    if not (ENABLED and NORM_MAX_ROWS >= 1 and GLU_MAX_ROWS >= 1):
        return False
    if not all(type(m) is SkinnyLinear and m.bias is None
               for m in (o_proj, gate_up_proj, down_proj)):
        return False
    return (bulk_listed(o_proj.weight, "plain") and bulk_listed(gate_up_proj.weight, "norm")
            and bulk_listed(down_proj.weight, "glu"))


def use_skinny_gemm(model: nn.Module) -> int:
    """Turn every plain ``nn.Linear`` of ``model`` named like a decoder projection into a
    ``SkinnyLinear`` (in place: parameters, names and state dict stay); the number turned.
    Nothing changes when ``CADENCE_DISABLE_SKINNY_GEMM`` is set."""
    if not ENABLED:
        return 0
    turned = 0
    for name, module in model.named_modules():
        if type(module) is nn.Linear and name.rsplit(".", 1)[-1] in PROJECTIONS:
            module.__class__ = SkinnyLinear
            turned += 1
    return turned
