"""Cases shared by the fused-norm skinny GEMM's tests (test_skinny_gemm_norm.py: the
interpreter and the CPU; test_skinny_gemm_norm_gpu.py): the sum of squares' order and the fused
launch against the RMSNorm kernel then the GEMM. Import it after ``TRITON_INTERPRET`` is set."""

from __future__ import annotations

import numpy as np
import torch

from cadence.model import fused_ops
from cadence.model.rms_norm_kernels import norm_chunk
from cadence.model.skinny_gemm import SkinnyConfig
from cadence.model.skinny_gemm_kernels import row_bucket, skinny_matmul, skinny_matmul_norm

try:
    import triton
    import triton.language as tl

    from cadence.model.rms_norm_kernels import row_sum_squares

    @triton.jit
    def _sum_squares_probe(x_ptr, r_ptr, out_ptr, rows, width, stride, HAS_RES: tl.constexpr,
                           ROWS: tl.constexpr, CHUNK: tl.constexpr):
        ss = row_sum_squares(x_ptr, r_ptr, stride, rows, width, HAS_RES, ROWS, CHUNK,
                             x_ptr.dtype.element_ty, "")
        tl.store(out_ptr + tl.arange(0, ROWS), ss)
except ImportError:  # pragma: no cover - CPU installs without triton
    triton = None

EPS = 1e-6
# The skinny GEMM's code paths (tensor cores and multiply-adds, unsplit and split over K), and
# shapes whose K is no multiple of the blocks (nor, past the first, of the norm's chunk).
SMALL_CONFIGS = [
    SkinnyConfig(block_n=16, block_k=32, split_k=1, dot=True),
    SkinnyConfig(block_n=32, block_k=16, split_k=4, dot=True),
    SkinnyConfig(block_n=8, block_k=64, split_k=1, num_warps=4, num_stages=1, dot=False),
    SkinnyConfig(block_n=16, block_k=32, split_k=3, num_warps=4, num_stages=1, dot=False),
]
SMALL_SHAPES = [(1, 64, 128), (3, 40, 100), (16, 33, 70), (5, 17, 300), (2, 24, 1100)]
# Qwen3-0.6B's and Llama-3-8B's qkv and gate_up projections: the ones that take a norm.
REAL_SHAPES = [(4096, 1024), (6144, 1024), (6144, 4096), (28672, 4096)]


def ordered_sum_squares(s: np.ndarray, chunk: int) -> np.ndarray:
    """The order rms_norm_kernels defines, in float32 numpy: lanes over chunks, then pairs."""
    rows, width = s.shape
    acc = np.zeros((rows, chunk), np.float32)
    for k0 in range(0, width, chunk):
        part = np.zeros((rows, chunk), np.float32)
        part[:, : min(chunk, width - k0)] = s[:, k0 : k0 + chunk]
        acc = acc + part * part
    while acc.shape[1] > 1:
        acc = acc[:, 0::2] + acc[:, 1::2]
    return acc[:, 0]


def check_sum_order(device: str, dtype: torch.dtype, warps: tuple[int, ...]) -> None:
    """row_sum_squares adds in the documented order whatever the tile's rows and warps, on
    values whose sum depends on the order (magnitudes over several decades)."""
    gen = torch.Generator().manual_seed(0)
    for rows, width in ((1, 17), (3, 1000), (4, 1024), (16, 4096), (2, 5000)):
        scale = torch.exp(torch.randn(rows, width, generator=gen) * 2)
        x = (torch.randn(rows, width, generator=gen) * scale).to(dtype)
        r = torch.randn(rows, width, generator=gen).to(dtype)
        chunk = norm_chunk(width)
        for has_res in (False, True):
            s = ((x.float() + r.float()).to(dtype) if has_res else x).float().numpy()
            want = torch.from_numpy(ordered_sum_squares(s, chunk))
            for block_rows in sorted({row_bucket(rows), 16}):
                for num_warps in warps:
                    out = torch.full((block_rows,), -1.0, device=device)
                    _sum_squares_probe[(1,)](x.to(device), r.to(device), out, rows, width,
                                             width, has_res, block_rows, chunk,
                                             num_warps=num_warps)
                    assert torch.equal(out[:rows].cpu(), want), (rows, width, num_warps)
                    assert not out[rows:].any()


def norm_operands(m: int, n: int, k: int, dtype: torch.dtype, device: str, seed: int = 0
                  ) -> tuple[torch.Tensor, ...]:
    """x, residual, norm weight, weight, bias: products of about unit size."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=gen) * 3).to(device, dtype)
    r = torch.randn(m, k, generator=gen).to(device, dtype)
    nw = (1 + 0.2 * torch.randn(k, generator=gen)).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(device, dtype)
    b = torch.randn(n, generator=gen).to(device, dtype)
    return x, r, nw, w, b


def two_kernels(x: torch.Tensor, r: torch.Tensor | None, nw: torch.Tensor,
                w: torch.Tensor, b: torch.Tensor | None, cfg: SkinnyConfig
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The RMSNorm kernel, then the GEMM."""
    if r is None:
        h, s = fused_ops.rms_norm_triton(x, nw, EPS), x
    else:
        h, s = fused_ops.add_rms_norm_triton(x, r, nw, EPS)
    return skinny_matmul(h, w, b, cfg), s


def check_fused(device: str, dtype: torch.dtype, m: int, n: int, k: int,
                cfg: SkinnyConfig) -> None:
    """One launch with the norm in its loads: the bits of the RMSNorm kernel then the GEMM."""
    x, r, nw, w, b = norm_operands(m, n, k, dtype, device, seed=m + n + k)
    before = (x.clone(), r.clone())
    for res in (r, None):
        for bias in (b, None):
            out, s = skinny_matmul_norm(x, res, nw, EPS, w, bias, cfg)
            want, want_s = two_kernels(x, res, nw, w, bias, cfg)
            assert torch.equal(s, want_s), (cfg, m, n, k, dtype)
            assert torch.equal(out, want), (cfg, m, n, k, dtype, res is None)
            assert s is x if res is None else s.data_ptr() not in (x.data_ptr(), r.data_ptr())
    assert torch.equal(x, before[0]) and torch.equal(r, before[1])  # never in place


def late_reference(s: torch.Tensor, nw: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
                   ) -> torch.Tensor:
    """The late norm's result in float64 from the residual sum s (as the RMSNorm kernel
    rounds it): ``rms_norm(s) * nw @ w.T + b``."""
    s64 = s.double().cpu()
    nw, w = nw.cpu(), w.cpu()
    h = s64 * torch.rsqrt(s64.pow(2).mean(dim=1, keepdim=True) + EPS) * nw.double()
    out = h @ w.double().T
    return out if b is None else out + b.double().cpu()


def check_late(device: str, dtype: torch.dtype, m: int, n: int, k: int,
               cfg: SkinnyConfig) -> None:
    """The late norm (scale after the products): the new residual exact, the output within
    the dtype's rounding of float64's, the same bits on repeat; x and r untouched."""
    x, r, nw, w, b = norm_operands(m, n, k, dtype, device, seed=m + n + k)
    x[0, 0] = 40.0  # a row far from unit size: the scale really is applied per row
    before = (x.clone(), r.clone())
    for res in (r, None):
        for bias in (b, None):
            out, s = skinny_matmul_norm(x, res, nw, EPS, w, bias, cfg, late_norm=True)
            _, want_s = two_kernels(x, res, nw, w, bias, cfg)
            assert torch.equal(s, want_s), (cfg, m, n, k, dtype)
            want = late_reference(s, nw, w, bias)
            assert s is x if res is None else s.data_ptr() not in (x.data_ptr(), r.data_ptr())
            err = (out.double().cpu() - want).abs()
            scale = want.abs().max().item()
            # bf16: a rounding of s * nw (2^-9 relative, over K terms) and of the output.
            assert err.max().item() <= 2e-2 * scale, (cfg, m, n, k, dtype, err.max().item())
            again, _ = skinny_matmul_norm(x, res, nw, EPS, w, bias, cfg, late_norm=True)
            assert torch.equal(out, again), (cfg, m, n, k, dtype)
    assert torch.equal(x, before[0]) and torch.equal(r, before[1])  # never in place


def run_interpreter_cases() -> None:
    check_sum_order("cpu", torch.float16, (4,))
    for cfg in SMALL_CONFIGS:
        for m, n, k in SMALL_SHAPES:
            check_fused("cpu", torch.float16, m, n, k, cfg)
            if not cfg.dot:  # the interpreter's tl.dot does not take bfloat16
                check_fused("cpu", torch.bfloat16, m, n, k, cfg)
            check_late("cpu", torch.bfloat16 if not cfg.dot else torch.float16, m, n, k, cfg)
