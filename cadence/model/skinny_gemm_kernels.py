"""The Triton kernel behind ``skinny_gemm``: ``x @ W.T (+ b)`` for a few rows of ``x`` [M, K] and
an ``nn.Linear`` weight ``W`` [N, K], split over K so that every SM streams its share of ``W``.

Program ``(i, s)`` takes output columns ``[i * BLOCK_N, (i + 1) * BLOCK_N)`` and the ``s``-th of
``split_k`` slices of K. With one slice it writes the output; with several it stores its float32
partial sums in a workspace ``[split_k, M, N]`` and bumps the arrival counter of its column
block: the last program to arrive adds the slices up in slice order (so the result does not
depend on the order the programs ran in: a CUDA graph and an eager call give the same bits),
writes the output and puts the counter back to zero for the next launch. One kernel, no memset.

The products run on the tensor cores (``DOT``: the rows padded to 16, ``W`` as the left operand)
or as float32 multiply-adds (``BLOCK_M`` rows, for one to a few rows).
Importing this module without Triton defines ``SkinnyConfig`` and a ``skinny_matmul`` that raises.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from cadence.runtime.triton_launch import PreparedLaunch, TritonLaunch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None

__all__ = [
    "MAX_COUNTERS", "SkinnyConfig", "SkinnyPlan", "arrival_counters", "has_scratch", "launch_shape",
    "row_bucket", "skinny_matmul", "skinny_plan",
]

# Arrival counters per device, one per column block of a split launch; a launch with more
# column blocks than this runs unsplit.
MAX_COUNTERS = 1 << 16
DOT_ROWS = 16  # tl.dot's smallest tile: the rows of x are padded with zeros up to it

_skinny_gemm_kernel = None

if triton is not None:

    @triton.jit
    def _finish(total, out_ptr, b_ptr, offs_m, offs_n, M, N, stride_o, HAS_BIAS: tl.constexpr):
        if HAS_BIAS:
            bias = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0)
            total += bias.to(tl.float32)[None, :]
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(out_ptr + offs_m[:, None] * stride_o + offs_n[None, :],
                 total.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_mul(gate, up):
        # fused_ops' SwiGLU, rounding where it rounds: the same bits as its output.
        g = gate.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
        return (act * up.to(tl.float32)).to(gate.dtype)

    @triton.jit(do_not_specialize=["M", "split_k"])
    def _skinny_gemm_kernel(
        x_ptr, w_ptr, b_ptr, out_ptr, part_ptr, count_ptr,
        M, N, K, stride_x, stride_w, stride_o, k_per_split, split_k,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        DOT: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr,
        GLU: tl.constexpr,
    ):  # fmt: skip
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        # Rows of x past M read as zeros (no memory traffic); rows of W past N re-read the last
        # one (in bounds: no mask on the weight stream). Neither result is stored.
        x_ok = offs_m[:, None] < M
        w_rows = tl.minimum(offs_n, N - 1).to(tl.int64)
        x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_x + offs_k[None, :]
        w_ptrs = w_ptr + w_rows[:, None] * stride_w + offs_k[None, :]
        # k_per_split is a multiple of BLOCK_K: no tile crosses into the next slice.
        k_start = pid_k * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
        if DOT:
            acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        elif BLOCK_M == 1:
            acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            if EVEN_K:
                x = tl.load(x_ptrs + k0, mask=x_ok, other=0.0)
                if GLU:  # x holds [gate | up]: the K inputs are silu(gate) * up
                    x = _silu_mul(x, tl.load(x_ptrs + K + k0, mask=x_ok, other=0.0))
                w = tl.load(w_ptrs + k0)
            else:
                k_ok = (k0 + offs_k) < K
                x = tl.load(x_ptrs + k0, mask=x_ok & k_ok[None, :], other=0.0)
                if GLU:
                    up = tl.load(x_ptrs + K + k0, mask=x_ok & k_ok[None, :], other=0.0)
                    x = _silu_mul(x, up)
                w = tl.load(w_ptrs + k0, mask=k_ok[None, :], other=0.0)
            if DOT:
                acc = tl.dot(w, tl.trans(x), acc)
            elif BLOCK_M == 1:
                acc += w.to(tl.float32) * x.to(tl.float32)
            else:
                acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
        if DOT:
            total = tl.trans(acc)
        elif BLOCK_M == 1:
            total = tl.sum(acc, axis=1)[None, :]
        else:
            total = tl.sum(acc, axis=2)
        if not SPLIT:
            _finish(total, out_ptr, b_ptr, offs_m, offs_n, M, N, stride_o, HAS_BIAS)
        else:
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            part_offs = offs_m[:, None] * N + offs_n[None, :]
            tl.store(part_ptr + pid_k * M * N + part_offs, total, mask=mask)
            # Every thread's partial stores happen before the (single-thread) release below.
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == split_k - 1:
                summed = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                slice_size = M * N
                for s in range(0, split_k, 4):
                    # Four slices' loads in flight, added in slice order (absent slices add 0).
                    # .cg: from L2, where the other SMs' stores are (L1 is not coherent).
                    base = part_ptr + s * slice_size + part_offs
                    p0 = tl.load(base, mask=mask, other=0.0, cache_modifier=".cg")
                    p1 = tl.load(base + slice_size, mask=mask & (s + 1 < split_k), other=0.0,
                                 cache_modifier=".cg")
                    p2 = tl.load(base + 2 * slice_size, mask=mask & (s + 2 < split_k),
                                 other=0.0, cache_modifier=".cg")
                    p3 = tl.load(base + 3 * slice_size, mask=mask & (s + 3 < split_k),
                                 other=0.0, cache_modifier=".cg")
                    summed = (((summed + p0) + p1) + p2) + p3
                _finish(summed, out_ptr, b_ptr, offs_m, offs_n, M, N, stride_o, HAS_BIAS)
                tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")

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


def _launch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: SkinnyConfig,
    out: torch.Tensor, part: torch.Tensor, counters: torch.Tensor, shape: LaunchShape,
    glu: bool = False,
) -> tuple[tuple, dict]:
    """The kernel's arguments and constexprs (with the launch options) for one call; with
    ``glu`` x is ``[M, 2K]`` (gate | up) for a weight ``[N, K]``."""
    m = x.shape[0]
    n, k = weight.shape
    args = (x, weight, out if bias is None else bias, out, part, counters, m, n, k,
            x.stride(0), weight.stride(0), out.stride(0), shape.k_per_split, shape.split_k)
    constexprs = dict(
        BLOCK_M=shape.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, DOT=cfg.dot,
        SPLIT=shape.split_k > 1, EVEN_K=k % cfg.block_k == 0, HAS_BIAS=bias is not None,
        GLU=glu, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return args, constexprs


def _workspace(shape: LaunchShape, m: int, n: int, stand_in: torch.Tensor) -> torch.Tensor:
    if shape.split_k == 1:
        return stand_in
    return torch.empty((shape.split_k, m, n), dtype=torch.float32, device=stand_in.device)


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
            x, weight, out if bias is None else bias, out, part, self.counters, m, n, self.k,
            self.x_width, self.k, n, shape.k_per_split, shape.split_k))  # fmt: skip
        return out


def skinny_plan(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                cfg: SkinnyConfig, glu: bool = False) -> SkinnyPlan | None:
    """The plan of ``skinny_matmul(x, weight, bias, cfg, glu)`` once that call has run (it
    compiles the kernel); None where the launch must keep going through ``skinny_matmul``."""
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
    args, constexprs = _launch(x.as_strided((m, width), (width, 1)), weight, bias, cfg, out,
                               part, counters, shape, glu)
    launch = _SKINNY.prepared(args, **constexprs)
    if launch is None:
        return None
    return SkinnyPlan(m, n, k, width, shape, x.get_device(), counters, stand_in, launch)
