"""The early-load decode attention kernel: ``triton_decode_kernels``' decode kernel (same
arguments, same partial results for its split merge, always storing the new K/V) with its loads
ordered for a short chain of dependent loads, for one-sequence decode steps whose qkv
projection lets it launch early (``attention_tiles.decode_config``).

A short-context program is a chain of dependent loads (metadata, block table, keys, values).
Here what no kernel of the step writes (the step's metadata, the rope table, the norm weights,
the cached keys and values of earlier tokens) is requested before the grid-dependency wait, so
it streams while the qkv projection ends; only q and the new k/v (that projection's output) are
read after it. The new token's key and value are used from registers and stored last, so no
store-then-load stands before the first tile. Launched by ``cadence.model.triton_attention``.
"""

from __future__ import annotations

from cadence.model.triton_decode_kernels import _for_cache, _tanh

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None

_decode_early_kernel = None

if triton is not None:
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:  # an older Triton: no PDL launches (pdl_enabled says so)
        gdc_launch_dependents = gdc_wait = None

    @triton.jit
    def _rope_table(offs_d, pos, cs_ptr, stride_cs, HEAD_DIM: tl.constexpr):
        # The cos and sin _norm_rope rotates by at ``pos`` (step metadata and a constant).
        half: tl.constexpr = HEAD_DIM // 2
        col = tl.where(offs_d < half, offs_d, offs_d - half)
        cmask = offs_d < HEAD_DIM
        cos = tl.load(cs_ptr + pos * stride_cs + col, mask=cmask, other=0.0).to(tl.float32)
        sin = tl.load(cs_ptr + pos * stride_cs + half + col, mask=cmask, other=0.0).to(tl.float32)
        return cos, sin

    @triton.jit
    def _norm_weights(offs_d, w_ptr, HEAD_DIM: tl.constexpr):
        # A head norm's weight at each element and at its rotate-half partner (constants).
        half: tl.constexpr = HEAD_DIM // 2
        partner = tl.where(offs_d < half, offs_d + half, offs_d - half)
        cmask = offs_d < HEAD_DIM
        w = tl.load(w_ptr + offs_d, mask=cmask, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + partner, mask=cmask, other=0.0).to(tl.float32)
        return w, wp

    @triton.jit
    def _norm_rope(x_ptr, rows, offs_d, mask, cos, sin, w, wp, eps, HEAD_DIM: tl.constexpr,
                   NORM: tl.constexpr):
        # fused_ops.qk_norm_rope on load: per-head RMSNorm (normalize, round, scale, round),
        # then rotate-half RoPE (``_rope_table``'s cos and sin), rounded to x's dtype. ``rows``
        # address the heads.
        half: tl.constexpr = HEAD_DIM // 2
        partner = tl.where(offs_d < half, offs_d + half, offs_d - half)
        x = tl.load(x_ptr + rows + offs_d, mask=mask, other=0.0).to(tl.float32)
        xp = tl.load(x_ptr + rows + partner, mask=mask, other=0.0).to(tl.float32)
        dt = x_ptr.dtype.element_ty
        if NORM:
            rstd = tl.math.rsqrt(tl.sum(x * x, axis=-1, keep_dims=True) / HEAD_DIM + eps)
            x = ((x * rstd).to(dt).to(tl.float32) * w).to(dt).to(tl.float32)
            xp = ((xp * rstd).to(dt).to(tl.float32) * wp).to(dt).to(tl.float32)
        sign = tl.where(offs_d < half, -1.0, 1.0)
        return (x * cos + sign * xp * sin).to(dt)

    @triton.jit
    def _scores(s, qk_scale, cap_scale, SOFTCAP: tl.constexpr):
        s = s * qk_scale
        if SOFTCAP:
            s = cap_scale * _tanh(s)
        return s

    @triton.jit
    def _tile_scores(q, k, nmask, qk_scale, cap_scale, SOFTCAP: tl.constexpr,
                     IEEE: tl.constexpr):
        # Scores of q against a tile of keys (log2 units), -inf where ``nmask`` has no key.
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        return tl.where(nmask[None, :], _scores(s, qk_scale, cap_scale, SOFTCAP), float("-inf"))

    @triton.jit
    def _online_update(s, v, m_i, l_i, acc, IEEE: tl.constexpr, EMPTY: tl.constexpr):
        # One tile of the online softmax: scores ``s`` (log2 units, -inf where masked) against
        # values ``v``. With EMPTY the tile may hold no key: it leaves the state as it was.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if EMPTY:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_use = m_new
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc * alpha[:, None] + pv

    @triton.jit
    def _decode_early_kernel(
        q_ptr, cache_ptr, out_ptr, part_acc_ptr, part_ml_ptr, k_ptr, v_ptr, slot_ptr,
        seq_lens_ptr, qsl_ptr, bt_ptr, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt,
        stride_vh, stride_ot, stride_oh, stride_c0, stride_c1, stride_c2, stride_c3, stride_bt,
        qk_scale, num_splits, window, cap_scale, v_scale, k_inv, v_inv, pos_ptr, cs_ptr,
        stride_cs, qw_ptr, kw_ptr, eps,
        NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
        PAGE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, SLIDING: tl.constexpr,
        SOFTCAP: tl.constexpr, IEEE: tl.constexpr, FP8: tl.constexpr, ROPE: tl.constexpr,
        QK_NORM: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        # Scores and values are computed in q's dtype (an FP8 cache's entries are converted to
        # it); an FP8 cache's key scale is folded into qk_scale, its value scale into the output.
        # NOTE: the loads before the wait rely on the kernel before this one (the qkv
        # projection) letting it launch only after its own wait: every earlier kernel of the
        # step has then finished, including the ones that wrote the step's metadata. Earlier
        # tokens' keys and values are earlier steps' writes.
        if PDL:
            # NOTE: the next kernel may start before this one waits: its own wait still orders
            # it after this grid (and so after the grid this one waits on), and what it does
            # before that wait reads only constants (the o projection's weight stages).
            gdc_launch_dependents()
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
        cached_end = tl.minimum(end, seq_len - 1)  # the new token is not read from the cache

        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        heads = kvh * GROUP + offs_g
        gmask = offs_g < GROUP
        dmask = offs_d < HEAD_DIM
        qmask = gmask[:, None] & dmask[None, :] & valid
        bt_row = bt_ptr + b.to(tl.int64) * stride_bt
        head_off = kvh.to(tl.int64) * stride_c3
        # The first tile of cached keys and values.
        offs_n = start + tl.arange(0, BLOCK_N)
        nmask0 = offs_n < cached_end
        page = tl.load(bt_row + offs_n // PAGE, mask=nmask0, other=0).to(tl.int64)
        kv_off = page * stride_c1 + (offs_n % PAGE).to(tl.int64) * stride_c2 + head_off
        kvmask = nmask0[:, None] & dmask[None, :]
        k0 = tl.load(cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kvmask, other=0.0)
        v0 = tl.load(cache_ptr + stride_c0 + kv_off[:, None] + offs_d[None, :], mask=kvmask,
                     other=0.0)
        # The split holding the new token writes its K/V for this kv head.
        owner = valid & (seq_len - 1 >= start) & (seq_len - 1 < end)
        slot = tl.load(slot_ptr + q_tok, mask=owner, other=-1).to(tl.int64)
        smask = dmask & owner & (slot >= 0)
        safe = tl.maximum(slot, 0)
        dst = (safe // PAGE) * stride_c1 + (safe % PAGE) * stride_c2 + head_off + offs_d
        if ROPE:
            pos = tl.load(pos_ptr + q_tok, mask=valid, other=0).to(tl.int64)
            cos, sin = _rope_table(offs_d, pos, cs_ptr, stride_cs, HEAD_DIM)
            if QK_NORM:
                qw, qwp = _norm_weights(offs_d, qw_ptr, HEAD_DIM)
                kw, kwp = _norm_weights(offs_d, kw_ptr, HEAD_DIM)
            else:  # unused by _norm_rope
                qw, qwp = cos, sin
                kw, kwp = cos, sin
        if PDL:
            gdc_wait()
        # With ROPE, q and the new k arrive as the qkv projection left them: the q/k norms (with
        # QK_NORM) and RoPE are applied here, as fused_ops.qk_norm_rope would have.
        kvh64 = kvh.to(tl.int64)
        if ROPE:
            q = _norm_rope(q_ptr + q_tok * stride_qt, heads[:, None] * stride_qh, offs_d[None, :],
                           qmask, cos, sin, qw, qwp, eps, HEAD_DIM, QK_NORM)
            k_new = _norm_rope(k_ptr + q_tok * stride_kt, kvh64 * stride_kh, offs_d, smask,
                               cos, sin, kw, kwp, eps, HEAD_DIM, QK_NORM)
        else:
            q = tl.load(q_ptr + q_tok * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                        mask=qmask, other=0.0)
            k_new = tl.load(k_ptr + q_tok * stride_kt + kvh64 * stride_kh + offs_d, mask=smask,
                            other=0.0)
        v_new = tl.load(v_ptr + q_tok * stride_vt + kvh64 * stride_vh + offs_d, mask=smask,
                        other=0.0)
        cache_ty = cache_ptr.dtype.element_ty
        k_c = _for_cache(k_new, k_inv, FP8).to(cache_ty)
        v_c = _for_cache(v_new, v_inv, FP8).to(cache_ty)

        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        s = _tile_scores(q, k0.to(q.dtype), nmask0, qk_scale, cap_scale, SOFTCAP, IEEE)
        m_i, l_i, acc = _online_update(s, v0.to(q.dtype), m_i, l_i, acc, IEEE, True)
        for n0 in range(start + BLOCK_N, cached_end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            nmask = offs_n < cached_end
            page = tl.load(bt_row + offs_n // PAGE, mask=nmask, other=0).to(tl.int64)
            kv_off = page * stride_c1 + (offs_n % PAGE).to(tl.int64) * stride_c2 + head_off
            kvmask = nmask[:, None] & dmask[None, :]
            k = tl.load(cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kvmask, other=0.0)
            s = _tile_scores(q, k.to(q.dtype), nmask, qk_scale, cap_scale, SOFTCAP, IEEE)
            v = tl.load(
                cache_ptr + stride_c0 + kv_off[:, None] + offs_d[None, :], mask=kvmask, other=0.0
            ).to(q.dtype)
            m_i, l_i, acc = _online_update(s, v, m_i, l_i, acc, IEEE, False)

        # The new token last, as the cache holds it (an FP8 cache's rounding included).
        kf = k_c.to(q.dtype).to(tl.float32)
        s_new = _scores(tl.sum(q.to(tl.float32) * kf[None, :], 1), qk_scale, cap_scale, SOFTCAP)
        s_new = tl.where(owner, s_new, float("-inf"))
        m_new = tl.maximum(m_i, s_new)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p_new = tl.exp2(s_new - m_use)
        l_i = l_i * alpha + p_new
        vf = v_c.to(q.dtype).to(tl.float32)
        acc = acc * alpha[:, None] + p_new.to(q.dtype).to(tl.float32)[:, None] * vf[None, :]
        m_i = m_new
        tl.store(cache_ptr + dst, k_c, mask=smask)
        tl.store(cache_ptr + stride_c0 + dst, v_c, mask=smask)

        if FP8:
            acc = acc * v_scale  # linear: the split merge needs no scale of its own
        if SPLIT:
            row = (b * NUM_HEADS + heads).to(tl.int64) * num_splits + split
            tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc,
                     mask=gmask[:, None] & dmask[None, :])
            tl.store(part_ml_ptr + row * 2, m_i, mask=gmask)
            tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=gmask)
        else:
            l_safe = tl.where(l_i > 0.0, l_i, 1.0)
            out = acc / l_safe[:, None]
            tl.store(out_ptr + q_tok * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=qmask)
