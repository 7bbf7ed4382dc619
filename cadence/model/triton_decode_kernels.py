"""The Triton kernels of decode attention (one query token per sequence) over the paged KV cache:
one program per (sequence, kv head, split) for all query heads of its group, with the new K/V
written to the cache in the same launch (and optionally the q/k norms and RoPE applied on load),
then the merge of the splits' partial results. Launched by ``cadence.model.triton_attention``.
Importing this module without Triton installed defines nothing.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None

_decode_kernel = _merge_splits_kernel = _tanh = _for_cache = None

if triton is not None:
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:  # an older Triton: no PDL launches (pdl_enabled says so)
        gdc_launch_dependents = gdc_wait = None

    @triton.jit
    def _tanh(x):
        # Saturates to +-1 without NaN: exp2 overflows to inf for large x. Near 0 the difference
        # 1 - 2 / (e + 1) cancels (a relative error of ~1e-4 at |x| = 1e-3), so small |x| take
        # the Taylor series instead (error < 1e-7 below 0.25).
        big = 1.0 - 2.0 / (tl.exp2(x * 2.8853900817779268) + 1.0)
        x2 = x * x
        small = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333
                                                               + x2 * -0.05396825396825397)))
        return tl.where(tl.abs(x) < 0.25, small, big)

    @triton.jit
    def _for_cache(x, inv_scale, FP8: tl.constexpr):
        # An FP8 cache holds x / scale, saturated to e4m3's finite range (no NaN on overflow).
        if FP8:
            return tl.minimum(tl.maximum(x.to(tl.float32) * inv_scale, -448.0), 448.0)
        else:
            return x

    @triton.jit
    def _norm_rope(x_ptr, rows, offs_d, mask, pos, cs_ptr, stride_cs, w_ptr, eps,
                   HEAD_DIM: tl.constexpr, NORM: tl.constexpr):
        # fused_ops.qk_norm_rope on load: per-head RMSNorm (normalize, round, scale, round),
        # then rotate-half RoPE at ``pos``, rounded to x's dtype. ``rows`` address the heads.
        half: tl.constexpr = HEAD_DIM // 2
        partner = tl.where(offs_d < half, offs_d + half, offs_d - half)
        x = tl.load(x_ptr + rows + offs_d, mask=mask, other=0.0).to(tl.float32)
        xp = tl.load(x_ptr + rows + partner, mask=mask, other=0.0).to(tl.float32)
        dt = x_ptr.dtype.element_ty
        if NORM:
            rstd = tl.math.rsqrt(tl.sum(x * x, axis=-1, keep_dims=True) / HEAD_DIM + eps)
            w = tl.load(w_ptr + offs_d, mask=offs_d < HEAD_DIM, other=0.0).to(tl.float32)
            wp = tl.load(w_ptr + partner, mask=offs_d < HEAD_DIM, other=0.0).to(tl.float32)
            x = ((x * rstd).to(dt).to(tl.float32) * w).to(dt).to(tl.float32)
            xp = ((xp * rstd).to(dt).to(tl.float32) * wp).to(dt).to(tl.float32)
        col = tl.where(offs_d < half, offs_d, offs_d - half)
        cmask = offs_d < HEAD_DIM
        cos = tl.load(cs_ptr + pos * stride_cs + col, mask=cmask, other=0.0).to(tl.float32)
        sin = tl.load(cs_ptr + pos * stride_cs + half + col, mask=cmask, other=0.0).to(tl.float32)
        sign = tl.where(offs_d < half, -1.0, 1.0)
        return (x * cos + sign * xp * sin).to(dt)

    @triton.jit
    def _decode_kernel(
        q_ptr,
        cache_ptr,
        out_ptr,
        part_acc_ptr,
        part_ml_ptr,
        k_ptr,
        v_ptr,
        slot_ptr,
        seq_lens_ptr,
        qsl_ptr,
        bt_ptr,
        stride_qt,
        stride_qh,
        stride_kt,
        stride_kh,
        stride_vt,
        stride_vh,
        stride_ot,
        stride_oh,
        stride_c0,
        stride_c1,
        stride_c2,
        stride_c3,
        stride_bt,
        qk_scale,
        num_splits,
        window,
        cap_scale,
        v_scale,
        k_inv,
        v_inv,
        pos_ptr,
        cs_ptr,
        stride_cs,
        qw_ptr,
        kw_ptr,
        eps,
        NUM_HEADS: tl.constexpr,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        PAGE: tl.constexpr,
        BLOCK_G: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SPLIT: tl.constexpr,
        STORE: tl.constexpr,
        SLIDING: tl.constexpr,
        SOFTCAP: tl.constexpr,
        IEEE: tl.constexpr,
        FP8: tl.constexpr,
        ROPE: tl.constexpr,
        QK_NORM: tl.constexpr,
        PDL: tl.constexpr,
    ):
        if PDL:  # q, k, v, the step's metadata and the cache are earlier kernels' writes
            # NOTE: the next kernel may start before this one waits: its own wait still orders
            # it after this grid (and so after the grid this one waits on), and what it does
            # before that wait reads only constants (the o projection's weight stages).
            gdc_launch_dependents()
            gdc_wait()
        # With ROPE, q and the new k arrive as the qkv projection left them: the q/k norms (with
        # QK_NORM) and RoPE are applied here, as fused_ops.qk_norm_rope would have.
        # Scores and values are computed in q's dtype (an FP8 cache's entries are converted to
        # it); an FP8 cache's key scale is folded into qk_scale, its value scale into the output.
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        seq_len = tl.load(seq_lens_ptr + b)
        q_tok = tl.load(qsl_ptr + b).to(tl.int64)
        q_end = tl.load(qsl_ptr + b + 1)
        valid = (q_end > q_tok) & (seq_len > 0)
        # The query (position seq_len - 1) sees keys lo ... seq_len - 1; the splits share them.
        if SLIDING:
            lo = tl.maximum(seq_len - window, 0)
        else:
            lo = 0
        per_split = tl.cdiv(tl.cdiv(seq_len - lo, num_splits), BLOCK_N) * BLOCK_N
        start = lo + split * per_split
        end = tl.minimum(start + per_split, seq_len)
        end = tl.where(valid, end, start)

        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        heads = kvh * GROUP + offs_g
        gmask = offs_g < GROUP
        dmask = offs_d < HEAD_DIM
        qmask = gmask[:, None] & dmask[None, :] & valid
        if ROPE:
            pos = tl.load(pos_ptr + q_tok, mask=valid, other=0).to(tl.int64)
            q = _norm_rope(q_ptr + q_tok * stride_qt, heads[:, None] * stride_qh, offs_d[None, :],
                           qmask, pos, cs_ptr, stride_cs, qw_ptr, eps, HEAD_DIM, QK_NORM)
        else:
            q = tl.load(
                q_ptr + q_tok * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=qmask,
                other=0.0,
            )

        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        bt_row = bt_ptr + b.to(tl.int64) * stride_bt
        head_off = kvh.to(tl.int64) * stride_c3
        if STORE:
            # The split holding the new token (position seq_len - 1) writes its K/V for this kv
            # head, then reads it back in the loop below like any other cached token.
            owner = (seq_len - 1 >= start) & (seq_len - 1 < end)
            slot = tl.load(slot_ptr + q_tok, mask=owner, other=-1).to(tl.int64)
            smask = dmask & owner & (slot >= 0)
            safe = tl.maximum(slot, 0)
            dst = (safe // PAGE) * stride_c1 + (safe % PAGE) * stride_c2 + head_off + offs_d
            kvh64 = kvh.to(tl.int64)
            if ROPE:
                k_new = _norm_rope(k_ptr + q_tok * stride_kt, kvh64 * stride_kh, offs_d, smask,
                                   pos, cs_ptr, stride_cs, kw_ptr, eps, HEAD_DIM, QK_NORM)
            else:
                k_new = tl.load(k_ptr + q_tok * stride_kt + kvh64 * stride_kh + offs_d,
                                mask=smask)
            v_new = tl.load(v_ptr + q_tok * stride_vt + kvh64 * stride_vh + offs_d, mask=smask)
            cache_ty = cache_ptr.dtype.element_ty
            tl.store(cache_ptr + dst, _for_cache(k_new, k_inv, FP8).to(cache_ty), mask=smask)
            tl.store(cache_ptr + stride_c0 + dst, _for_cache(v_new, v_inv, FP8).to(cache_ty),
                     mask=smask)
            # Global writes become visible to the other threads of the program at the barrier.
            tl.debug_barrier()
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            nmask = offs_n < end
            page = tl.load(bt_row + offs_n // PAGE, mask=nmask, other=0).to(tl.int64)
            kv_off = page * stride_c1 + (offs_n % PAGE).to(tl.int64) * stride_c2 + head_off
            kvmask = nmask[:, None] & dmask[None, :]
            k = tl.load(cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kvmask, other=0.0)
            k = k.to(q.dtype)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * qk_scale
            if SOFTCAP:
                s = cap_scale * _tanh(s)
            s = tl.where(nmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(
                cache_ptr + stride_c0 + kv_off[:, None] + offs_d[None, :], mask=kvmask, other=0.0
            ).to(q.dtype)
            if IEEE:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new

        if FP8:
            acc = acc * v_scale  # linear: the split merge needs no scale of its own
        if SPLIT:
            row = (b * NUM_HEADS + heads).to(tl.int64) * num_splits + split
            tl.store(
                part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
                acc,
                mask=gmask[:, None] & dmask[None, :],
            )
            tl.store(part_ml_ptr + row * 2, m_i, mask=gmask)
            tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=gmask)
        else:
            l_safe = tl.where(l_i > 0.0, l_i, 1.0)
            out = acc / l_safe[:, None]
            tl.store(
                out_ptr + q_tok * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                out.to(out_ptr.dtype.element_ty),
                mask=qmask,
            )

    @triton.jit
    def _merge_splits_kernel(
        part_acc_ptr,
        part_ml_ptr,
        out_ptr,
        seq_lens_ptr,
        qsl_ptr,
        stride_ot,
        stride_oh,
        num_splits,
        NUM_HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_D: tl.constexpr,
        PDL: tl.constexpr,
    ):
        if PDL:  # released first, as the decode kernel: o's weights stream during attention
            gdc_launch_dependents()
            gdc_wait()
        b = tl.program_id(0)
        h = tl.program_id(1)
        seq_len = tl.load(seq_lens_ptr + b)
        q_tok = tl.load(qsl_ptr + b).to(tl.int64)
        q_end = tl.load(qsl_ptr + b + 1)
        valid = (q_end > q_tok) & (seq_len > 0)
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_D)
        smask = offs_s < num_splits
        dmask = offs_d < HEAD_DIM
        row = (b * NUM_HEADS + h).to(tl.int64) * num_splits + offs_s
        m = tl.load(part_ml_ptr + row * 2, mask=smask, other=float("-inf"))
        l_part = tl.load(part_ml_ptr + row * 2 + 1, mask=smask, other=0.0)
        m_max = tl.max(m, 0)
        m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
        w = tl.exp2(m - m_max)
        acc = tl.load(
            part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
            mask=smask[:, None] & dmask[None, :],
            other=0.0,
        )
        denom = tl.sum(l_part * w, 0)
        denom = tl.where(denom > 0.0, denom, 1.0)
        out = tl.sum(acc * w[:, None], 0) / denom
        tl.store(
            out_ptr + q_tok * stride_ot + h * stride_oh + offs_d,
            out.to(out_ptr.dtype.element_ty),
            mask=dmask & valid,
        )
