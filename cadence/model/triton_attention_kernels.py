"""The Triton kernels behind ``triton_attention``: KV store, paged decode, split merge, varlen.

Launch them through ``cadence.model.triton_attention``, which checks shapes and picks grids.
Importing this module without Triton installed defines nothing.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None

_store_kv_kernel = _decode_kernel = _merge_splits_kernel = _varlen_kernel = _varlen_tile = None
_tanh = None

if triton is not None:

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
    def _store_kv_kernel(
        k_ptr,
        v_ptr,
        cache_ptr,
        slot_ptr,
        stride_kt,
        stride_kh,
        stride_vt,
        stride_vh,
        stride_c0,
        stride_c1,
        stride_c2,
        stride_c3,
        k_inv,
        v_inv,
        NUM_KV_HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        PAGE: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_D: tl.constexpr,
        FP8: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM) & (slot >= 0)
        safe = tl.maximum(slot, 0)
        dst = (safe // PAGE) * stride_c1 + (safe % PAGE) * stride_c2
        dst = dst + offs_h[:, None] * stride_c3 + offs_d[None, :]
        k = tl.load(
            k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask
        )
        v = tl.load(
            v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask
        )
        cache_ty = cache_ptr.dtype.element_ty
        tl.store(cache_ptr + dst, _for_cache(k, k_inv, FP8).to(cache_ty), mask=mask)
        tl.store(cache_ptr + stride_c0 + dst, _for_cache(v, v_inv, FP8).to(cache_ty), mask=mask)

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
    ):
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
            k_new = tl.load(k_ptr + q_tok * stride_kt + kvh64 * stride_kh + offs_d, mask=smask)
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
    ):
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

    @triton.jit
    def _varlen_tile(
        q,
        acc,
        m_i,
        l_i,
        cache_ptr,
        bt_row,
        head_off,
        n0,
        q_pos,
        kv_end,
        offs_d,
        dmask,
        qk_scale,
        window,
        cap_scale,
        stride_c0,
        stride_c1,
        stride_c2,
        PAGE: tl.constexpr,
        BLOCK_N: tl.constexpr,
        MASK: tl.constexpr,
        SLIDING: tl.constexpr,
        SOFTCAP: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        """One key/value tile of the online softmax; MASK=False for tiles every row sees."""
        offs_n = n0 + tl.arange(0, BLOCK_N)
        if MASK:
            nmask = offs_n < kv_end
            page = tl.load(bt_row + offs_n // PAGE, mask=nmask, other=0).to(tl.int64)
        else:
            page = tl.load(bt_row + offs_n // PAGE).to(tl.int64)
        kv_off = page * stride_c1 + (offs_n % PAGE).to(tl.int64) * stride_c2 + head_off
        ptrs = cache_ptr + kv_off[:, None] + offs_d[None, :]
        if MASK:
            kvmask = nmask[:, None] & dmask[None, :]
            k = tl.load(ptrs, mask=kvmask, other=0.0)
        else:
            k = tl.load(ptrs, mask=dmask[None, :], other=0.0)
        k = k.to(q.dtype)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * qk_scale
        if SOFTCAP:
            s = cap_scale * _tanh(s)
        if MASK:
            keep = nmask[None, :] & (offs_n[None, :] <= q_pos[:, None])
            if SLIDING:
                keep = keep & (offs_n[None, :] > q_pos[:, None] - window)
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASK and SLIDING:
            # A row may see no key of a tile before its window starts: m_new stays -inf and the
            # exponentials use 0 in its place (alpha and p are 0 for such a row).
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            # Without a window, key 0 is in the first tile and visible to every row; a tile
            # without a mask is visible to every row: m_new is finite.
            m_use = m_new
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASK:
            v = tl.load(ptrs + stride_c0, mask=kvmask, other=0.0)
        else:
            v = tl.load(ptrs + stride_c0, mask=dmask[None, :], other=0.0)
        v = v.to(q.dtype)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        return acc, m_new, l_i

    @triton.jit
    def _varlen_kernel(
        q_ptr,
        cache_ptr,
        out_ptr,
        seq_lens_ptr,
        qsl_ptr,
        bt_ptr,
        stride_qt,
        stride_qh,
        stride_ot,
        stride_oh,
        stride_c0,
        stride_c1,
        stride_c2,
        stride_c3,
        stride_bt,
        qk_scale,
        num_seqs,
        window,
        cap_scale,
        v_scale,
        GROUP: tl.constexpr,
        GROUP_P: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        PAGE: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        SLIDING: tl.constexpr,
        SOFTCAP: tl.constexpr,
        IEEE: tl.constexpr,
        FP8: tl.constexpr,
    ):
        # Program (pid, kvh) covers BLOCK_Q query tokens of one sequence times the GROUP query
        # heads of kv head kvh. Sequence b's query blocks are numbered from
        # qsl[b] // BLOCK_Q + b upwards: strictly increasing in b, and never more than
        # num_tokens // BLOCK_Q + num_seqs in all, so the grid depends on shapes only.
        BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_P
        pid = tl.program_id(0)
        kvh = tl.program_id(1)
        lo = 0
        hi = num_seqs
        while lo < hi:  # the last sequence whose first block is at or before pid
            mid = (lo + hi) // 2
            if tl.load(qsl_ptr + mid) // BLOCK_Q + mid <= pid:
                lo = mid + 1
            else:
                hi = mid
        b = lo - 1
        q_start = tl.load(qsl_ptr + b)
        q_len = tl.load(qsl_ptr + b + 1) - q_start
        seq_len = tl.load(seq_lens_ptr + b)
        qb = pid - (q_start // BLOCK_Q + b)
        num_blocks = tl.cdiv(q_len, BLOCK_Q)
        if (qb >= num_blocks) | (seq_len <= 0):
            return  # past the sequence's queries, or a padding sequence
        # The last blocks see the most keys: they take the lowest program ids (start first).
        qb = num_blocks - 1 - qb
        ctx = seq_len - q_len

        offs_m = tl.arange(0, BLOCK_M)
        q_idx = qb * BLOCK_Q + offs_m // GROUP_P
        g = offs_m % GROUP_P
        offs_d = tl.arange(0, BLOCK_D)
        dmask = offs_d < HEAD_DIM
        rmask = (q_idx < q_len) & (g < GROUP)
        rows = (q_start + q_idx).to(tl.int64)
        heads = kvh * GROUP + g
        mask2 = rmask[:, None] & dmask[None, :]
        q = tl.load(
            q_ptr + rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
            mask=mask2,
            other=0.0,
        )
        # Rows outside the query range see every key (finite numbers) and are never stored.
        q_pos = tl.where(rmask, ctx + q_idx, seq_len - 1)
        kv_end = tl.minimum(seq_len, ctx + (qb + 1) * BLOCK_Q)
        # Keys before ctx + qb * BLOCK_Q + 1 are visible to every row: whole tiles of them
        # need no mask.
        full_end = tl.minimum((ctx + qb * BLOCK_Q + 1) // BLOCK_N * BLOCK_N, kv_end)
        if SLIDING:
            # The block's first row (position ctx + qb * BLOCK_Q) sees keys from first_key on;
            # keys from kv_end - window on are in every row's window (kv_start <= full_start
            # <= full_end).
            first_key = tl.maximum(ctx + qb * BLOCK_Q - window + 1, 0)
            kv_start = first_key // BLOCK_N * BLOCK_N
            full_start = tl.minimum(
                tl.cdiv(tl.maximum(kv_end - window, 0), BLOCK_N) * BLOCK_N, full_end
            )
        else:
            full_start = 0

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        bt_row = bt_ptr + b.to(tl.int64) * stride_bt
        head_off = kvh.to(tl.int64) * stride_c3
        if SLIDING:
            for n0 in range(kv_start, full_start, BLOCK_N):
                acc, m_i, l_i = _varlen_tile(
                    q, acc, m_i, l_i, cache_ptr, bt_row, head_off, n0, q_pos, kv_end, offs_d,
                    dmask, qk_scale, window, cap_scale, stride_c0, stride_c1, stride_c2, PAGE, BLOCK_N,
                    True, SLIDING, SOFTCAP, IEEE,
                )  # fmt: skip
        for n0 in range(full_start, full_end, BLOCK_N):
            acc, m_i, l_i = _varlen_tile(
                q, acc, m_i, l_i, cache_ptr, bt_row, head_off, n0, q_pos, kv_end, offs_d, dmask,
                qk_scale, window, cap_scale, stride_c0, stride_c1, stride_c2, PAGE, BLOCK_N, False,
                SLIDING, SOFTCAP, IEEE,
            )  # fmt: skip
        for n0 in range(full_end, kv_end, BLOCK_N):
            acc, m_i, l_i = _varlen_tile(
                q, acc, m_i, l_i, cache_ptr, bt_row, head_off, n0, q_pos, kv_end, offs_d, dmask,
                qk_scale, window, cap_scale, stride_c0, stride_c1, stride_c2, PAGE, BLOCK_N, True,
                SLIDING, SOFTCAP, IEEE,
            )  # fmt: skip

        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / l_safe[:, None]
        if FP8:
            out = out * v_scale
        tl.store(
            out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=mask2,
        )
