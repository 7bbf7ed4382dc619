"""The Triton kernels behind ``triton_attention``: KV store and varlen (prefill, mixed steps); the
decode kernels are in ``triton_decode_kernels``.

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

from cadence.model.triton_decode_kernels import _for_cache, _tanh

_store_kv_kernel = _varlen_kernel = _varlen_block = _varlen_tile = None

if triton is not None:

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
    def _varlen_block(
        q_ptr, cache_ptr, out_ptr, bt_ptr, b, kvh, q_start, q_len, seq_len, qb, stride_qt,
        stride_qh, stride_ot, stride_oh, stride_c0, stride_c1, stride_c2, stride_c3, stride_bt,
        qk_scale, window, cap_scale, v_scale, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
        SLIDING: tl.constexpr, SOFTCAP: tl.constexpr, IEEE: tl.constexpr, FP8: tl.constexpr,
    ):  # fmt: skip
        """Query block ``qb`` of sequence ``b`` (numbered from the sequence's end) against its
        keys, rows ``BLOCK_Q`` tokens x the group's ``GROUP`` query heads, into ``out``."""
        ctx = seq_len - q_len
        offs_m = tl.arange(0, BLOCK_M)
        g = offs_m % GROUP_P
        offs_d = tl.arange(0, BLOCK_D)
        dmask = offs_d < HEAD_DIM
        heads = kvh * GROUP + g
        head_off = kvh.to(tl.int64) * stride_c3
        q_idx = qb * BLOCK_Q + offs_m // GROUP_P
        rmask = (q_idx < q_len) & (g < GROUP)
        rows = (q_start + q_idx).to(tl.int64)
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
        BLOCK_S: tl.constexpr,
        RELOAD: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        SLIDING: tl.constexpr,
        SOFTCAP: tl.constexpr,
        IEEE: tl.constexpr,
        FP8: tl.constexpr,
    ):
        # Query blocks: sequence b's are numbered from first[b] = qsl[b] // BLOCK_Q + b upwards
        # (strictly increasing in b, never more than num_tokens // BLOCK_Q + num_seqs in all).
        # Program (kvh, p) takes blocks p, p + P, p + 2P, ... of kv head kvh, up to the last
        # live sequence's last block: the grid depends on shapes only, and a bucket's padding
        # sequences cost each program one look at the sequence table, not a program each.
        BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_P
        kvh = tl.program_id(0)
        offs_s = tl.arange(0, BLOCK_S)
        smask = offs_s < num_seqs
        starts = tl.load(qsl_ptr + offs_s, mask=smask, other=0)
        ends = tl.load(qsl_ptr + offs_s + 1, mask=smask, other=0)
        lens = tl.load(seq_lens_ptr + offs_s, mask=smask, other=0)
        first = starts // BLOCK_Q + offs_s
        live = smask & (lens > 0) & (ends > starts)
        end_block = tl.max(tl.where(live, first + tl.cdiv(ends - starts, BLOCK_Q), 0), 0)
        for vb in range(tl.program_id(1), end_block, tl.num_programs(1)):
            if RELOAD:  # a long table is read again per block, not held through the attention
                b_starts = tl.load(qsl_ptr + offs_s, mask=smask, other=0)
                b_ends = tl.load(qsl_ptr + offs_s + 1, mask=smask, other=0)
                b_lens = tl.load(seq_lens_ptr + offs_s, mask=smask, other=0)
                b_first = b_starts // BLOCK_Q + offs_s
            else:
                b_starts, b_ends, b_lens, b_first = starts, ends, lens, first
            # The last sequence whose first block is at or before vb.
            b = tl.max(tl.where(smask & (b_first <= vb), offs_s, 0), 0)
            pick = offs_s == b
            q_start = tl.sum(tl.where(pick, b_starts, 0), 0)
            q_len = tl.sum(tl.where(pick, b_ends, 0), 0) - q_start
            seq_len = tl.sum(tl.where(pick, b_lens, 0), 0)
            qb = vb - (q_start // BLOCK_Q + b)
            num_blocks = tl.cdiv(q_len, BLOCK_Q)
            # Past the sequence's queries, or a padding sequence: nothing to do.
            if (qb < num_blocks) & (seq_len > 0):
                _varlen_block(
                    q_ptr, cache_ptr, out_ptr, bt_ptr, b, kvh, q_start, q_len, seq_len,
                    num_blocks - 1 - qb, stride_qt, stride_qh, stride_ot, stride_oh, stride_c0,
                    stride_c1, stride_c2, stride_c3, stride_bt, qk_scale, window, cap_scale,
                    v_scale, GROUP, GROUP_P, HEAD_DIM, BLOCK_Q, BLOCK_M, BLOCK_N, BLOCK_D, PAGE,
                    SLIDING, SOFTCAP, IEEE, FP8,
                )  # fmt: skip
