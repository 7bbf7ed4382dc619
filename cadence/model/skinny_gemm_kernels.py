"""Launches of the skinny GEMM kernel (``skinny_gemm_triton``): ``x @ W.T (+ b)`` for a few rows
of ``x`` [M, K] and an ``nn.Linear`` weight ``W`` [N, K], split over K so that every SM streams
its share of ``W``; its configurations, grid shapes, split-K scratch (arrival counters) and the
plans that resolve a launch once per projection and row count. ``skinny_matmul_norm`` runs the
GEMM with the input's residual add and RMSNorm in its loads (``late_norm``: the norm's scale
applied after the products, see ``skinny_gemm_triton``).

Importing this module without Triton defines ``SkinnyConfig`` and launchers that raise.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from cadence.model.fused_ops import add_rms_norm, rms_norm
from cadence.model.rms_norm_kernels import norm_chunk
from cadence.model.skinny_gemm_triton import _skinny_gemm_kernel
from cadence.runtime.triton_launch import PreparedLaunch, TritonLaunch, pdl_enabled

try:
    import triton
except ImportError:  # pragma: no cover - CPU installs
    triton = None

__all__ = [
    "MAX_COUNTERS", "SkinnyConfig", "SkinnyPlan", "arrival_counters", "has_scratch", "launch_shape",
    "row_bucket", "skinny_matmul", "skinny_matmul_norm", "skinny_plan",
]

# Arrival counters per device, one per column block of a split launch; a launch with more
# column blocks than this runs unsplit.
MAX_COUNTERS = 1 << 16
DOT_ROWS = 16  # tl.dot's smallest tile: the rows of x are padded with zeros up to it

if triton is not None:
    _SKINNY = TritonLaunch(_skinny_gemm_kernel)


@dataclass(frozen=True)
class SkinnyConfig:
    """One launch configuration. ``split_k`` is an upper bound: the launch uses as many slices
    as keep each at least ``block_k`` long (fewer where K is short)."""

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    dot: bool = True  # tensor cores (rows padded to 16); False: float32 multiply-adds


def row_bucket(rows: int) -> int:
    """The row count configurations are chosen for (1, 4, 8 or 16), and the rows the float32
    path computes at once: every row count of a bucket gives each row the same bits."""
    if rows <= 1:
        return 1
    if rows <= 4:
        return 4
    return 8 if rows <= 8 else 16


@dataclass(frozen=True)
class LaunchShape:
    block_m: int
    column_blocks: int
    split_k: int
    k_per_split: int


@functools.lru_cache(maxsize=4096)
def launch_shape(m: int, n: int, k: int, cfg: SkinnyConfig) -> LaunchShape:
    """The grid and K slicing ``skinny_matmul`` uses for ``cfg`` on an ``[m, k] x [n, k]``."""
    column_blocks = -(-n // cfg.block_n)
    tiles = -(-k // cfg.block_k)
    split = max(1, min(cfg.split_k, tiles))
    if column_blocks > MAX_COUNTERS:
        split = 1
    k_per_split = -(-tiles // split) * cfg.block_k
    split = -(-k // k_per_split)  # no empty slices
    block_m = DOT_ROWS if cfg.dot else row_bucket(m)
    return LaunchShape(block_m, column_blocks, split, k_per_split)


# Per device index: (arrival counters [MAX_COUNTERS] int32, all zero between launches; a
# float32 stand-in for the workspace of unsplit launches).
_SCRATCH: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def has_scratch(device: torch.device) -> bool:
    return device.index in _SCRATCH


def _scratch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    scratch = _SCRATCH.get(device.index)
    if scratch is None:
        # Allocated under a graph capture, the counters would be zeroed only when the graph
        # replays: callers make sure the first launch on a device is eager.
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the first skinny GEMM on a device must run outside graph capture")
        scratch = (torch.zeros(MAX_COUNTERS, dtype=torch.int32, device=device),
                   torch.zeros(1, dtype=torch.float32, device=device))
        _SCRATCH[device.index] = scratch
    return scratch


def arrival_counters(device: torch.device) -> torch.Tensor:
    """The device's split-K arrival counters (``MAX_COUNTERS``, zero between launches), shared
    by every split-K GEMM of the device (this one and the FP8 weight-only kernels)."""
    return _scratch(device)[0]


# An RMSNorm fused into a launch: (residual or None, norm weight, eps, new residual's buffer,
# late: the norm's scale after the products).
NormArgs = tuple[torch.Tensor | None, torch.Tensor, float, torch.Tensor, bool]


def _launch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: SkinnyConfig,
    out: torch.Tensor, part: torch.Tensor, counters: torch.Tensor, shape: LaunchShape,
    glu: bool = False, norm: NormArgs | None = None,
) -> tuple[tuple, dict]:
    """The kernel's arguments and constexprs (with the launch options) for one call; with
    ``glu`` x is ``[M, 2K]`` (gate | up) for a weight ``[N, K]``."""
    m = x.shape[0]
    n, k = weight.shape
    residual, norm_weight, eps, res_out, late = (x, x, 0.0, x, False) if norm is None else norm
    args = (x, weight, out if bias is None else bias, out, part, counters,
            x if residual is None else residual, norm_weight, res_out, eps, m, n, k,
            x.stride(0), weight.stride(0), out.stride(0), shape.k_per_split, shape.split_k)
    constexprs = dict(
        BLOCK_M=shape.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, DOT=cfg.dot,
        SPLIT=shape.split_k > 1, EVEN_K=k % cfg.block_k == 0, HAS_BIAS=bias is not None,
        GLU=glu, NORM=norm is not None, HAS_RES=norm is not None and residual is not None,
        NORM_ROWS=1 if norm is None or late else row_bucket(m),
        NORM_CHUNK=1 if norm is None or late else norm_chunk(k), NORM_LATE=late,
        pdl=pdl_enabled(x.device), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return args, constexprs


def _workspace(shape: LaunchShape, m: int, n: int, stand_in: torch.Tensor) -> torch.Tensor:
    """A split launch's float32 partial products ``[split_k, M, N]``, then room for its slices'
    sums of squares ``[split_k, M]`` (used by the late norm)."""
    if shape.split_k == 1:
        return stand_in
    return torch.empty(shape.split_k * m * (n + 1), dtype=torch.float32,
                       device=stand_in.device)


def skinny_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  cfg: SkinnyConfig, glu: bool = False) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` in ``x``'s dtype for ``x`` [M <= 16, K] with unit column stride
    and a row-major ``weight`` [N, K] of the same dtype (and ``bias`` [N]). With ``glu``, ``x``
    is ``[M, 2K]``, gate then up, and the product is ``silu_and_mul(x) @ weight.T (+ bias)``
    (SwiGLU in the kernel's loads, rounded as ``fused_ops.silu_and_mul`` rounds).

    Launches on the current stream; the split launches of one device share its counters, so
    two of them must not run at the same time on different streams."""
    if triton is None:
        raise ImportError("skinny GEMMs need triton")
    m = x.shape[0]
    n, k = weight.shape
    if x.shape[1] != (2 * k if glu else k):
        raise ValueError(f"x {tuple(x.shape)} does not fit a weight {tuple(weight.shape)}"
                         f"{' (gate | up)' if glu else ''}")
    if m > DOT_ROWS:
        raise ValueError(f"skinny GEMMs take at most {DOT_ROWS} rows, got {m}")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_() if bias is None else out.copy_(bias.expand(m, n))
    shape = launch_shape(m, n, k, cfg)
    counters, stand_in = _scratch(x.device)
    part = _workspace(shape, m, n, stand_in)
    args, constexprs = _launch(x, weight, bias, cfg, out, part, counters, shape, glu)
    _SKINNY((shape.column_blocks, shape.split_k), args, **constexprs)
    return out


def _norm_fits(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
               k: int) -> bool:
    """What the fused norm takes: a contiguous ``residual`` of x's shape and dtype (or none)
    and a contiguous ``norm_weight`` [K] of that dtype, next to a contiguous x [M, K]."""
    if not x.is_contiguous() or norm_weight.shape != (k,) or not norm_weight.is_contiguous():
        return False
    if norm_weight.dtype != x.dtype or x.shape[1] != k:
        return False
    return residual is None or (residual.shape == x.shape and residual.dtype == x.dtype
                                and residual.is_contiguous())


def skinny_matmul_norm(x: torch.Tensor, residual: torch.Tensor | None,
                       norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                       bias: torch.Tensor | None, cfg: SkinnyConfig, late_norm: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(skinny_matmul(h, weight, bias, cfg), s)`` for ``h, s = fused_ops.add_rms_norm(x,
    residual, norm_weight, eps)`` (``h = fused_ops.rms_norm(x, norm_weight, eps)`` and
    ``s = x`` without a residual), in one launch: every program adds, normalizes and scales its
    part of x as it loads it, with the bits of those two kernels. ``x``, ``residual`` [M <= 16,
    K] and ``norm_weight`` [K] are contiguous and of ``weight``'s dtype; ``s`` is a new tensor
    (x itself without a residual). With ``late_norm`` the loads scale by the norm weight only
    and the rows' inverse RMS scales the products (no read of the rows ahead of the weights;
    ``s`` exact, the output within a rounding of ``h``'s, not its bits). ``s * norm_weight``
    is then rounded before the scale: in float16 it must stay in range, which the decoder's
    dispatch (``skinny_gemm.norm_fusion``, bfloat16 only) ensures and which tests in float16
    (the interpreter's dots take no bfloat16) keep to."""
    if triton is None:
        raise ImportError("skinny GEMMs need triton")
    m = x.shape[0]
    n, k = weight.shape
    if not _norm_fits(x, residual, norm_weight, k) or x.dtype != weight.dtype:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype}, its residual and its norm weight "
                         f"do not fit a weight {tuple(weight.shape)} {weight.dtype}")
    if m > DOT_ROWS:
        raise ValueError(f"skinny GEMMs take at most {DOT_ROWS} rows, got {m}")
    if m == 0 or n == 0 or k == 0:
        h, s = ((rms_norm(x, norm_weight, eps), x) if residual is None
                else add_rms_norm(x, residual, norm_weight, eps))
        return skinny_matmul(h, weight, bias, cfg), s
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    res_out = x if residual is None else torch.empty_like(x)
    shape = launch_shape(m, n, k, cfg)
    counters, stand_in = _scratch(x.device)
    part = _workspace(shape, m, n, stand_in)
    args, constexprs = _launch(x, weight, bias, cfg, out, part, counters, shape,
                               norm=(residual, norm_weight, eps, res_out, late_norm))
    _SKINNY((shape.column_blocks, shape.split_k), args, **constexprs)
    return out, res_out


@dataclass(frozen=True)
class SkinnyPlan:
    """``skinny_matmul`` for one weight, row count and configuration, resolved once: an eager
    decode step calls each projection's plan instead of choosing and keying its launch again.
    The caller passes tensors that specialize like the ones the plan was made from (same
    dtype and device, contiguous ``x`` of the same rows and pointer alignment)."""

    m: int
    n: int
    k: int
    x_width: int  # K, or 2K for a GLU plan
    shape: LaunchShape
    device: int
    counters: torch.Tensor
    stand_in: torch.Tensor
    launch: PreparedLaunch

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                 ) -> torch.Tensor:
        m, n, shape = self.m, self.n, self.shape
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        part = _workspace(shape, m, n, self.stand_in)
        # x's row stride matters only past one row, where contiguity makes it its width.
        self.launch(shape.column_blocks, shape.split_k, 1, self.device, (
            x, weight, out if bias is None else bias, out, part, self.counters, x, x, x, 0.0,
            m, n, self.k, self.x_width, self.k, n, shape.k_per_split, shape.split_k))  # fmt: skip
        return out

    def with_norm(self, x: torch.Tensor, residual: torch.Tensor | None,
                  norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                  bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``skinny_matmul_norm`` through a plan made with a norm (and a residual where this
        call has one)."""
        m, n, shape = self.m, self.n, self.shape
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        res_out = x if residual is None else torch.empty((m, self.k), dtype=x.dtype,
                                                         device=x.device)
        part = _workspace(shape, m, n, self.stand_in)
        self.launch(shape.column_blocks, shape.split_k, 1, self.device, (
            x, weight, out if bias is None else bias, out, part, self.counters,
            x if residual is None else residual, norm_weight, res_out, eps, m, n, self.k,
            self.x_width, self.k, n, shape.k_per_split, shape.split_k))  # fmt: skip
        return out, res_out


def skinny_plan(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                cfg: SkinnyConfig, glu: bool = False,
                norm: tuple[torch.Tensor | None, torch.Tensor, float, bool] | None = None,
                ) -> SkinnyPlan | None:
    """The plan of ``skinny_matmul(x, weight, bias, cfg, glu)`` (with ``norm = (residual,
    norm_weight, eps, late_norm)``: of ``skinny_matmul_norm``, called through
    ``SkinnyPlan.with_norm``)
    once that call has run (it compiles the kernel); None where the launch must keep going
    through the checked call."""
    m, width = x.shape
    n, k = weight.shape
    if triton is None or not (0 < m <= DOT_ROWS and n and k) or not has_scratch(x.device):
        return None
    if width != (2 * k if glu else k):
        return None
    if not (x.is_contiguous() and weight.is_contiguous() and weight.stride(0) == k):
        return None
    shape = launch_shape(m, n, k, cfg)
    counters, stand_in = _scratch(x.device)
    part = _workspace(shape, m, n, stand_in)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    x = x.as_strided((m, width), (width, 1))
    norm_args = None
    if norm is not None:
        residual, norm_weight, eps, late = norm
        if not _norm_fits(x, residual, norm_weight, k):
            return None
        res_out = x if residual is None else torch.empty_like(x)
        if residual is not None:
            residual = residual.as_strided((m, width), (width, 1))
        norm_args = (residual, norm_weight, eps, res_out, late)
    args, constexprs = _launch(x, weight, bias, cfg, out, part, counters, shape, glu, norm_args)
    launch = _SKINNY.prepared(args, **constexprs)
    if launch is None:
        return None
    return SkinnyPlan(m, n, k, width, shape, x.get_device(), counters, stand_in, launch)
