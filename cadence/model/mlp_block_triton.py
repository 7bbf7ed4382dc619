"""The Triton kernel behind ``mlp_block``: a decoder layer's second half for one token in one
launch, ``o_proj`` -> residual add + RMSNorm -> ``gate_up_proj`` -> SwiGLU -> ``down_proj``.

Every program streams its share of each weight (tiles of ``ROWS`` output rows, program ``p``
taking tiles ``p, p + G, ...`` of ``G`` programs, each tile's successor loaded before it is
summed) and the phases meet at grid barriers: one program per SM, all resident, each arriving
at a counter and waiting for the others. Before it waits, a program loads its first weight tile
of the next phase (weights do not depend on the phase before), so the wait overlaps that tile's
latency instead of adding a kernel boundary, a launch and a ramp-up per projection.

Phase results another program reads (the projection outputs) go through small scratch
vectors, read back with ``.cg`` loads (from L2: L1 is not coherent across SMs). The norm is
``rms_norm_kernels``' arithmetic (every program normalizes the whole row itself, a few KB from
L2), SwiGLU ``fused_ops.silu_and_mul``'s, and every projection output is rounded to the model
dtype where the unfused layer rounds it; only the order of each dot product's additions
differs from the unfused kernels'.

``PHASE`` -1 runs the three phases with the barriers between; 0, 1 or 2 runs one phase with no
barrier, for launches one phase at a time (Triton's interpreter runs programs one after the
other, so no program could wait for another there). The last program out puts the counters back
to zero for the next launch. Without Triton this module defines ``_mlp_block_kernel = None``.
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
    from cadence.model.skinny_gemm_triton import _silu_mul

_mlp_block_kernel = None  # without Triton

if triton is not None:

    @triton.jit
    def _grid_barrier(count_ptr, programs):
        """Wait until ``programs`` programs have arrived at ``count_ptr``; every store a
        program made before arriving is visible (in L2) to every program after it."""
        tl.debug_barrier()  # every thread's stores before the (single-thread) release
        arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu") + 1
        while arrived < programs:
            arrived = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()

    @triton.jit
    def _tile(w_ptr, t, n, k, offs_r, offs_k, ROWS: tl.constexpr):
        """Rows ``[t * ROWS, (t + 1) * ROWS)`` of a row-major ``[n, k]`` weight (zeros past
        ``n`` and ``k``), ``[ROWS, BLOCK_K]``."""
        rows = t * ROWS + offs_r
        mask = (rows < n)[:, None] & (offs_k < k)[None, :]
        return tl.load(w_ptr + rows[:, None].to(tl.int64) * k + offs_k[None, :], mask=mask,
                       other=0.0)

    @triton.jit
    def _project(w_ptr, w_first, x, out_ptr, n, k, pid, programs, offs_r, offs_k,
                 ROWS: tl.constexpr):
        """``out[r] = sum_k w[r, k] * x[k]`` over this program's tiles, rounded to out's dtype;
        ``w_first`` is the program's first tile, loaded already. Each tile's successor is
        loaded before the tile is summed, so one tile's loads are always in flight."""
        tiles = tl.cdiv(n, ROWS)
        w = w_first
        for t in range(pid, tiles, programs):
            w_next = _tile(w_ptr, t + programs, n, k, offs_r, offs_k, ROWS)
            y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            rows = t * ROWS + offs_r
            tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < n)
            w = w_next

    @triton.jit
    def _glu_project(w_ptr, g_first, u_first, x, out_ptr, inter, k, pid, programs, offs_r,
                     offs_k, ROWS: tl.constexpr):
        """SwiGLU of the gate and up rows (``[2 * inter, k]``: gate rows, then up rows):
        ``out[r] = silu(gate[r] . x) * (up[r] . x)``, each dot rounded to out's dtype first."""
        tiles = tl.cdiv(inter, ROWS)
        up_ptr = w_ptr + inter.to(tl.int64) * k
        g = g_first
        u = u_first
        for t in range(pid, tiles, programs):
            g_next = _tile(w_ptr, t + programs, inter, k, offs_r, offs_k, ROWS)
            u_next = _tile(up_ptr, t + programs, inter, k, offs_r, offs_k, ROWS)
            dt = out_ptr.dtype.element_ty
            gate = tl.sum(g.to(tl.float32) * x[None, :], axis=1).to(dt)
            up = tl.sum(u.to(tl.float32) * x[None, :], axis=1).to(dt)
            rows = t * ROWS + offs_r
            tl.store(out_ptr + rows, _silu_mul(gate, up), mask=rows < inter)
            g = g_next
            u = u_next

    @triton.jit
    def _mlp_block_kernel(
        a_ptr, wo_ptr, res_ptr, nw_ptr, wgu_ptr, wd_ptr, o_ptr, act_ptr, out_ptr, res_out_ptr,
        count_ptr, eps, hidden, q_width, inter,
        ROWS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_H: tl.constexpr,
        BLOCK_I: tl.constexpr, NORM_CHUNK: tl.constexpr, PHASE: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        dtype = out_ptr.dtype.element_ty
        offs_r = tl.arange(0, ROWS)
        offs_q = tl.arange(0, BLOCK_Q)
        offs_h = tl.arange(0, BLOCK_H)
        offs_i = tl.arange(0, BLOCK_I)
        up_ptr = wgu_ptr + inter.to(tl.int64) * hidden

        # Phase 0: o = W_o a (a: the attention's output, written by an earlier kernel).
        if PHASE == -1 or PHASE == 0:
            w0 = _tile(wo_ptr, pid, hidden, q_width, offs_r, offs_q, ROWS)
            if PDL:  # the weight tile is in flight while the kernel before ends
                gdc_wait()
            a = tl.load(a_ptr + offs_q, mask=offs_q < q_width, other=0.0).to(tl.float32)
            _project(wo_ptr, w0, a, o_ptr, hidden, q_width, pid, programs, offs_r, offs_q, ROWS)
        if PHASE == -1:  # the next phase's first tiles in flight while this program waits
            g0 = _tile(wgu_ptr, pid, inter, hidden, offs_r, offs_h, ROWS)
            u0 = _tile(up_ptr, pid, inter, hidden, offs_r, offs_h, ROWS)
            _grid_barrier(count_ptr, programs)

        # Phase 1: s = o + residual, h = RMSNorm(s) (every program, the whole row), then
        # act = SwiGLU(W_gate h, W_up h). Program 0 writes the new residual s.
        if PHASE == -1 or PHASE == 1:
            if PHASE == 1:
                g0 = _tile(wgu_ptr, pid, inter, hidden, offs_r, offs_h, ROWS)
                u0 = _tile(up_ptr, pid, inter, hidden, offs_r, offs_h, ROWS)
            ss = row_sum_squares(o_ptr, res_ptr, 0, 1, hidden, True, 1, NORM_CHUNK, dtype, ".cg")
            rstd = inverse_rms(ss, hidden, eps)
            h_ok = offs_h < hidden
            s = residual_sum(tl.load(o_ptr + offs_h, mask=h_ok, other=0.0, cache_modifier=".cg"),
                             tl.load(res_ptr + offs_h, mask=h_ok, other=0.0), dtype)
            tl.store(res_out_ptr + offs_h, s, mask=h_ok & (pid == 0))
            nw = tl.load(nw_ptr + offs_h, mask=h_ok, other=0.0)
            h = normalize(s[None, :], rstd, nw, dtype).to(dtype).to(tl.float32)
            h = tl.reshape(h, [BLOCK_H])
            _glu_project(wgu_ptr, g0, u0, h, act_ptr, inter, hidden, pid, programs, offs_r,
                         offs_h, ROWS)
        if PHASE == -1:
            d0 = _tile(wd_ptr, pid, hidden, inter, offs_r, offs_i, ROWS)
            _grid_barrier(count_ptr + 1, programs)

        # Phase 2: out = W_down act.
        if PDL:  # the next kernel may start (it waits for this one's end before its reads)
            gdc_launch_dependents()
        if PHASE == -1 or PHASE == 2:
            if PHASE == 2:
                d0 = _tile(wd_ptr, pid, hidden, inter, offs_r, offs_i, ROWS)
            act = tl.load(act_ptr + offs_i, mask=offs_i < inter, other=0.0,
                          cache_modifier=".cg").to(tl.float32)
            _project(wd_ptr, d0, act, out_ptr, hidden, inter, pid, programs, offs_r, offs_i, ROWS)

        if PHASE == -1:
            # Every program has passed both barriers before it arrives here: the last one out
            # resets the counters for the next launch (stream-ordered after this one).
            tl.debug_barrier()
            left = tl.atomic_add(count_ptr + 2, 1, sem="acq_rel", scope="gpu")
            if left == programs - 1:
                tl.atomic_xchg(count_ptr, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(count_ptr + 1, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(count_ptr + 2, 0, sem="relaxed", scope="gpu")
