"""RMSNorm's arithmetic as Triton building blocks, and the RMSNorm kernel built from them.

Two kernels normalize rows: the RMSNorm kernel here (``fused_ops.rms_norm`` and
``add_rms_norm`` on CUDA) and the skinny GEMM's fused-norm variant (``skinny_gemm_kernels``),
which normalizes the GEMM's input as it loads it. Both call these helpers, so that fusing the
norm into a projection changes no bit of its result.

``tl.sum`` adds in an order that follows the tile's layout (elements per thread, warps), which
differs between the two kernels, so the sum of squares is added in a fixed order of its own:
the row is cut into chunks of ``norm_chunk(width)`` elements, lane ``j`` of an accumulator adds
the chunks' ``j``-th squares in chunk order, and the lanes are then added pairwise (``j`` with
``j + 1`` for even ``j``, then the pairs' sums likewise). A float addition of two values is
commutative, so this tree gives the same bits whatever the layout. The squares of half-precision
values are exact in float32, so a multiply-add contraction cannot change them either, and the
mean divides with IEEE rounding (``div_rn``: Triton's ``/`` is an approximation that a constant
divisor may compile differently).
"""

from __future__ import annotations

import torch

from cadence.runtime.triton_launch import TritonLaunch, next_pow2

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None

__all__ = ["NORM_CHUNK_MAX", "as_rows", "launch_parts_rms_norm", "launch_rms_norm", "norm_chunk"]

# The longest chunk of the sum of squares: its lanes are an accumulator [rows, chunk] in
# registers of the GEMM's programs.
NORM_CHUNK_MAX = 512


def norm_chunk(width: int) -> int:
    """The chunk of the sum of squares for rows of ``width`` elements (part of the arithmetic:
    every kernel that normalizes such rows uses this one)."""
    return min(next_pow2(width), NORM_CHUNK_MAX)


if triton is not None:

    @triton.jit
    def pairwise_row_sum(v):
        """``[R, W]`` -> ``[R]``, ``W`` a power of two: adjacent lanes pairwise, level by level."""
        for _ in tl.static_range(16):
            if v.shape[1] > 1:
                v = tl.sum(tl.reshape(v, [v.shape[0], v.shape[1] // 2, 2]), axis=2)
        return tl.reshape(v, [v.shape[0]])

    @triton.jit
    def residual_sum(x, r, dtype: tl.constexpr):
        """The new residual stream: ``x + r`` in float32, rounded to ``dtype``."""
        return (x.to(tl.float32) + r.to(tl.float32)).to(dtype)

    @triton.jit
    def row_sum_squares(
        x_ptr, r_ptr, stride, rows, width,
        HAS_RES: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr, res_dtype: tl.constexpr,
        CACHE: tl.constexpr,
    ):  # fmt: skip
        """``[ROWS]`` float32: each row's sum of squares of ``x`` (of ``residual_sum(x, r)``
        with ``HAS_RES``) over its ``width`` elements, for rows ``< rows`` of a row stride
        ``stride`` shared by ``x`` and ``r`` (0 past ``rows``); ``CACHE`` is the loads' cache
        modifier (``".cg"`` for rows other programs of the same launch wrote)."""
        offs_m = tl.arange(0, ROWS)
        offs_c = tl.arange(0, CHUNK)
        row_ok = offs_m[:, None] < rows
        row_offs = offs_m[:, None].to(tl.int64) * stride + offs_c[None, :]
        acc = tl.zeros([ROWS, CHUNK], tl.float32)
        for k0 in range(0, width, CHUNK):
            ok = row_ok & (k0 + offs_c[None, :] < width)
            s = tl.load(x_ptr + row_offs + k0, mask=ok, other=0.0, cache_modifier=CACHE)
            if HAS_RES:
                r = tl.load(r_ptr + row_offs + k0, mask=ok, other=0.0, cache_modifier=CACHE)
                s = residual_sum(s, r, res_dtype)
            s = s.to(tl.float32)
            acc += s * s
        return pairwise_row_sum(acc)

    @triton.jit
    def inverse_rms(sum_squares, width, eps):
        """``1 / sqrt(sum_squares / width + eps)``; ``width`` an integer, constexpr or not."""
        mean = tl.math.div_rn(sum_squares, tl.zeros_like(sum_squares) + width)
        return tl.math.rsqrt(mean + eps)

    @triton.jit
    def normalize(s, rstd, w, dtype: tl.constexpr):
        """``[R, C]`` float32: ``s`` [R, C] times its row's ``rstd`` [R], rounded to ``dtype``
        (transformers' cast back), times the norm weight ``w`` [C]; the caller rounds it."""
        normed = (s.to(tl.float32) * rstd[:, None]).to(dtype).to(tl.float32)
        return normed * w.to(tl.float32)[None, :]

    @triton.jit
    def _rms_norm_kernel(
        x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
        stride_x, stride_r, stride_o, stride_ro, eps,
        N: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + row * stride_x
        r_row = res_ptr + row * stride_r
        res_dtype = res_out_ptr.dtype.element_ty
        # The residual sum is rounded to the residual stream's dtype before it is normalized;
        # the sum of squares adds it up chunk by chunk, the row is then normalized at once.
        if HAS_RESIDUAL:
            ss = row_sum_squares(x_row, r_row, 0, 1, N, True, 1, CHUNK, res_dtype, "")
        else:
            ss = row_sum_squares(x_row, x_row, 0, 1, N, False, 1, CHUNK, res_dtype, "")
        rstd = inverse_rms(ss, N, eps)
        offs = tl.arange(0, BLOCK)
        mask = offs[None, :] < N
        x = tl.load(x_row + offs[None, :], mask=mask, other=0.0)
        if HAS_RESIDUAL:
            x = residual_sum(x, tl.load(r_row + offs[None, :], mask=mask, other=0.0), res_dtype)
            tl.store(res_out_ptr + row * stride_ro + offs[None, :], x, mask=mask)
        w = tl.load(w_ptr + offs, mask=offs < N, other=0.0)
        y = normalize(x, rstd, w, x_ptr.dtype.element_ty)
        tl.store(out_ptr + row * stride_o + offs[None, :], y.to(out_ptr.dtype.element_ty),
                 mask=mask)

    @triton.jit
    def _parts_sum(p_row, part_stride, offs, mask, PARTS: tl.constexpr):
        """A K-split projection's float32 partial sums at ``offs``, added in part order."""
        acc = tl.load(p_row + offs, mask=mask, other=0.0)
        for part in tl.static_range(1, PARTS):
            acc += tl.load(p_row + part * part_stride + offs, mask=mask, other=0.0)
        return acc

    @triton.jit
    def _parts_rms_norm_kernel(
        p_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
        stride_part, stride_p, stride_r, stride_o, stride_ro, eps,
        N: tl.constexpr, PARTS: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # A K-split projection's float32 partial sums (model/split_k.py) are added in part
        # order and rounded to the residual stream's dtype: the projection's output, as a whole
        # product returns it. Then the residual add and the norm, as _rms_norm_kernel does them,
        # except that the sum of squares is one tl.sum over the row: the fixed chunk order of
        # row_sum_squares cost this kernel 0.6-0.9 us a call on an H200 (it runs twice a
        # layer), and the split's own K order already makes its bits differ from the whole
        # product's.
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)[None, :]
        mask = offs < N
        x = _parts_sum(p_ptr + row * stride_p, tl.cast(stride_part, tl.int64), offs, mask, PARTS)
        res_dtype = res_out_ptr.dtype.element_ty
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = residual_sum(x.to(res_dtype), r, res_dtype)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
        xf = x.to(tl.float32)
        rstd = inverse_rms(tl.sum(xf * xf, axis=1), N, eps)
        cols = tl.arange(0, BLOCK)
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0)
        y = normalize(x, rstd, w, res_dtype)
        tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

    # Launched through the compiled kernel's own launcher after the first call (see
    # cadence.runtime.triton_launch): the eager path's per-launch host cost.
    _RMS_NORM = TritonLaunch(_rms_norm_kernel)
    _PARTS_RMS_NORM = TritonLaunch(_parts_rms_norm_kernel)


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[rows, width]`` with a contiguous last dimension (a view where possible)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x.reshape(-1, x.shape[-1])


def _norm_warps(block: int) -> int:
    return min(8, max(1, block // 256))


def launch_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(rms_norm(s) * weight, s)`` with ``s = residual + x`` (``(rms_norm(x) * weight,
    None)`` without a residual), one program per row; ``weight`` contiguous."""
    shape, width = x.shape, x.shape[-1]
    x2 = as_rows(x)
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if residual is None:
        r2 = res_out = x2  # unused
    else:
        r2 = as_rows(residual)
        res_out = torch.empty(
            x2.shape, dtype=torch.promote_types(x.dtype, residual.dtype), device=x.device
        )
    if x2.shape[0] > 0:
        block = next_pow2(width)
        _RMS_NORM(
            (x2.shape[0],),
            (x2, r2, weight, out, res_out, x2.stride(0), r2.stride(0), out.stride(0),
             res_out.stride(0), eps),
            N=width, HAS_RESIDUAL=residual is not None, BLOCK=block, CHUNK=norm_chunk(width),
            num_warps=_norm_warps(block),
        )  # fmt: skip
    if residual is None:
        return out.view(shape), None
    return out.view(shape), res_out.view(shape)


def launch_parts_rms_norm(
    parts: torch.Tensor, dtype: torch.dtype, residual: torch.Tensor, weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``launch_rms_norm(x, residual, weight, eps)`` for ``x = parts.sum(0)`` rounded to
    ``dtype``: ``parts`` [S, rows, N] float32 (a K-split projection's partial sums, rows
    contiguous), ``residual`` [rows, N] contiguous, ``weight`` contiguous. One program a row."""
    num_parts, rows, width = parts.shape
    out = torch.empty((rows, width), dtype=torch.promote_types(dtype, weight.dtype),
                      device=parts.device)
    res_out = torch.empty((rows, width), dtype=torch.promote_types(dtype, residual.dtype),
                          device=parts.device)
    if rows > 0:
        block = next_pow2(width)
        _PARTS_RMS_NORM(
            (rows,),
            (parts, residual, weight, out, res_out, parts.stride(0), parts.stride(1),
             residual.stride(0), out.stride(0), res_out.stride(0), eps),
            N=width, PARTS=num_parts, BLOCK=block, num_warps=_norm_warps(block),
        )  # fmt: skip
    return out, res_out
