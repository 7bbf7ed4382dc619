"""The Triton kernel behind ``skinny_gemm`` (launched by ``skinny_gemm_kernels``): ``x @ W.T
(+ b)`` for a few rows of ``x`` [M, K] and an ``nn.Linear`` weight ``W`` [N, K], split over K so
that every SM streams its share of ``W``.

Program ``(i, s)`` takes output columns ``[i * BLOCK_N, (i + 1) * BLOCK_N)`` and the ``s``-th of
``split_k`` slices of K. With one slice it writes the output; with several it stores its float32
partial sums in a workspace ``[split_k, M, N]`` and bumps the arrival counter of its column
block: the last program to arrive adds the slices up in slice order (so the result does not
depend on the order the programs ran in: a CUDA graph and an eager call give the same bits),
writes the output and puts the counter back to zero for the next launch. One kernel, no memset.

The products run on the tensor cores (``DOT``: the rows padded to 16, ``W`` as the left operand)
or as float32 multiply-adds (``BLOCK_M`` rows, for one to a few rows).

With ``GLU`` the loads apply SwiGLU to x (gate | up); with ``NORM`` they add the residual and
apply RMSNorm as ``rms_norm_kernels`` defines it (each program takes its rows' norms over all of K
first), so that a projection with its input's norm fused in gives the bits of the two kernels.
With ``NORM_LATE`` instead, nothing is read ahead: the loads add the residual and scale by the
norm weight only, each program sums its slice's squares as it goes, and the output is scaled by
the rows' inverse RMS at the end (split launches store each slice's sums of squares after the
partial products; the last program adds them in slice order). Mathematically the same product,
one rounding fewer (``s * w`` is rounded to the model dtype, not ``s * rstd`` and then ``* w``),
so not the two kernels' bits.
With ``PDL`` (a programmatic dependent launch, ``triton_launch.pdl_enabled``) a program waits for
the kernel before to end before it touches memory, then lets the next kernel start launching.
Without Triton this module defines ``_skinny_gemm_kernel = None``.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None

if triton is not None:
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:  # an older Triton: no PDL launches (pdl_enabled says so)
        gdc_launch_dependents = gdc_wait = None

    from cadence.model.rms_norm_kernels import (
        inverse_rms,
        normalize,
        residual_sum,
        row_sum_squares,
    )

_skinny_gemm_kernel = None  # without Triton

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

    @triton.jit
    def _add_residual(x, r_ptrs, res_ptrs, mask, store_res, HAS_RES: tl.constexpr):
        """A tile of the new residual stream (x + r with ``HAS_RES``, else x), stored where
        ``store_res``."""
        if HAS_RES:
            x = residual_sum(x, tl.load(r_ptrs, mask=mask, other=0.0), x.dtype)
            tl.store(res_ptrs, x, mask=mask & store_res)
        return x

    @triton.jit
    def _norm_input(x, r_ptrs, res_ptrs, nw_ptr, rstd, offs_k, mask, k_ok, store_res,
                    HAS_RES: tl.constexpr):
        """A tile of the fused-norm GEMM's input: the residual sum (stored where
        ``store_res``), normalized and scaled as the RMSNorm kernel does."""
        x = _add_residual(x, r_ptrs, res_ptrs, mask, store_res, HAS_RES)
        nw = tl.load(nw_ptr + offs_k, mask=k_ok, other=0.0)
        return normalize(x, rstd, nw, x.dtype).to(x.dtype)

    @triton.jit
    def _late_norm_input(x, r_ptrs, res_ptrs, nw_ptr, offs_k, mask, k_ok, store_res,
                         HAS_RES: tl.constexpr):
        """A tile of the late-norm GEMM's input: the residual sum (stored where
        ``store_res``) times the norm weight, rounded to x's dtype, and the residual sum's
        squares (float32, added up across the row only after the K loop)."""
        x = _add_residual(x, r_ptrs, res_ptrs, mask, store_res, HAS_RES)
        xf = x.to(tl.float32)
        nw = tl.load(nw_ptr + offs_k, mask=k_ok, other=0.0)
        return (xf * nw.to(tl.float32)[None, :]).to(x.dtype), xf * xf

    @triton.jit(do_not_specialize=["M", "split_k"])
    def _skinny_gemm_kernel(
        x_ptr, w_ptr, b_ptr, out_ptr, part_ptr, count_ptr, r_ptr, nw_ptr, res_out_ptr, eps,
        M, N, K, stride_x, stride_w, stride_o, k_per_split, split_k,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        DOT: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr,
        GLU: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr,
        NORM_ROWS: tl.constexpr, NORM_CHUNK: tl.constexpr, NORM_LATE: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        if PDL:  # nothing before: x, the workspace and the counters are earlier kernels' too
            gdc_wait()
            gdc_launch_dependents()
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        # Rows of x past M read as zeros (no memory traffic); rows of W past N re-read the last
        # one (in bounds: no mask on the weight stream). Neither result is stored.
        x_ok = offs_m[:, None] < M
        w_rows = tl.minimum(offs_n, N - 1).to(tl.int64)
        row_offs = offs_m[:, None].to(tl.int64) * stride_x + offs_k[None, :]
        x_ptrs = x_ptr + row_offs
        w_ptrs = w_ptr + w_rows[:, None] * stride_w + offs_k[None, :]
        if NORM:
            store_res = pid_n == 0
        if NORM and NORM_LATE:
            squares = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
        if NORM and not NORM_LATE:
            # Every program normalizes with the whole rows' norms (the rows are a few KB, read
            # from L2); the programs of column block 0 write the new residual, each its slice
            # of K. r and the residual written are [M, K] with x's row stride.
            ss = row_sum_squares(x_ptr, r_ptr, stride_x, M, K, HAS_RES, NORM_ROWS, NORM_CHUNK,
                                 x_ptr.dtype.element_ty, "")
            rstd = inverse_rms(ss, K, eps)
            if NORM_ROWS != BLOCK_M:  # the tile's rows (padded to 16 for DOT): 0 past them
                picked = offs_m[:, None] == tl.arange(0, NORM_ROWS)[None, :]
                rstd = tl.sum(tl.where(picked, rstd[None, :], 0.0), axis=1)
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
                if NORM and NORM_LATE:
                    x, tile_ss = _late_norm_input(
                        x, r_ptr + row_offs + k0, res_out_ptr + row_offs + k0, nw_ptr + k0,
                        offs_k, x_ok, (k0 + offs_k) < K, store_res, HAS_RES)
                    squares += tile_ss
                elif NORM:
                    x = _norm_input(x, r_ptr + row_offs + k0, res_out_ptr + row_offs + k0,
                                    nw_ptr + k0, rstd, offs_k, x_ok, (k0 + offs_k) < K,
                                    store_res, HAS_RES)
                w = tl.load(w_ptrs + k0)
            else:
                k_ok = (k0 + offs_k) < K
                x = tl.load(x_ptrs + k0, mask=x_ok & k_ok[None, :], other=0.0)
                if GLU:
                    up = tl.load(x_ptrs + K + k0, mask=x_ok & k_ok[None, :], other=0.0)
                    x = _silu_mul(x, up)
                if NORM and NORM_LATE:
                    x, tile_ss = _late_norm_input(
                        x, r_ptr + row_offs + k0, res_out_ptr + row_offs + k0, nw_ptr + k0,
                        offs_k, x_ok & k_ok[None, :], k_ok, store_res, HAS_RES)
                    squares += tile_ss
                elif NORM:
                    x = _norm_input(x, r_ptr + row_offs + k0, res_out_ptr + row_offs + k0,
                                    nw_ptr + k0, rstd, offs_k, x_ok & k_ok[None, :], k_ok,
                                    store_res, HAS_RES)
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
        if NORM and NORM_LATE:
            ss = tl.sum(squares, axis=1)
        if not SPLIT:
            if NORM and NORM_LATE:
                total = total * inverse_rms(ss, K, eps)[:, None]
            _finish(total, out_ptr, b_ptr, offs_m, offs_n, M, N, stride_o, HAS_BIAS)
        else:
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            part_offs = offs_m[:, None] * N + offs_n[None, :]
            tl.store(part_ptr + pid_k * M * N + part_offs, total, mask=mask)
            if NORM and NORM_LATE:
                # After the M * N * split_k partial products: [split_k, M] sums of squares. Every
                # column block's program of a slice stores the same values there.
                ss_ptr = part_ptr + split_k * M * N
                tl.store(ss_ptr + pid_k * M + offs_m, ss, mask=offs_m < M)
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
                if NORM and NORM_LATE:
                    ss_all = tl.zeros([BLOCK_M], tl.float32)
                    for s in range(0, split_k):
                        ss_all += tl.load(ss_ptr + s * M + offs_m, mask=offs_m < M, other=0.0,
                                          cache_modifier=".cg")
                    summed = summed * inverse_rms(ss_all, K, eps)[:, None]
                _finish(summed, out_ptr, b_ptr, offs_m, offs_n, M, N, stride_o, HAS_BIAS)
                tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")
