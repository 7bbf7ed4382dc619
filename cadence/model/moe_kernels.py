"""The Triton kernels behind ``moe``: the two grouped GEMMs of a mixture-of-experts MLP, and
for small batches (decode) the router's softmax / top-k and the grouping of pairs by expert,
one launch each instead of a dozen torch operations.

Each program takes ``BLOCK_M`` (token, expert) pairs of one expert, in the order
``moe.group_by_expert`` lays them out, and one ``BLOCK_N`` slice of the output features.
Launch them through ``cadence.model.moe``. Importing this module without Triton defines nothing.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None

_moe_gate_up_kernel = _moe_down_kernel = None

if triton is not None:

    @triton.jit
    def _moe_gate_up_kernel(
        x_ptr,
        w_ptr,
        out_ptr,
        sorted_ptr,
        block_expert_ptr,
        scale_ptr,
        num_pairs,
        stride_xt,
        stride_we,
        stride_wn,
        stride_ot,
        TOP_K: tl.constexpr,
        HIDDEN: tl.constexpr,
        INTER: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        IEEE: tl.constexpr,
        FP8: tl.constexpr,
    ):
        """out[pair] = silu(x[token] @ gate[e].T) * (x[token] @ up[e].T), one slice of INTER.
        FP8 experts: e4m3 rows times their scales ``scale[e, row]`` (applied to the sums)."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        if expert < 0:
            return  # a block past the last expert's pairs
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_ptr + offs_m).to(tl.int64)
        pmask = pair < num_pairs  # padding entries hold num_pairs
        token = tl.where(pmask, pair // TOP_K, 0)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < INTER
        w_base = w_ptr + expert * stride_we
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, HIDDEN, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            kmask = offs_k < HIDDEN
            a = tl.load(
                x_ptr + token[:, None] * stride_xt + offs_k[None, :],
                mask=pmask[:, None] & kmask[None, :],
                other=0.0,
            )
            wmask = kmask[:, None] & nmask[None, :]
            wg = tl.load(
                w_base + offs_n[None, :] * stride_wn + offs_k[:, None], mask=wmask, other=0.0
            )
            wu = tl.load(
                w_base + (INTER + offs_n[None, :]) * stride_wn + offs_k[:, None],
                mask=wmask,
                other=0.0,
            )
            if FP8:
                wg = wg.to(a.dtype)
                wu = wu.to(a.dtype)
            if IEEE:
                acc_g += tl.dot(a, wg, input_precision="ieee")
                acc_u += tl.dot(a, wu, input_precision="ieee")
            else:
                acc_g += tl.dot(a, wg)
                acc_u += tl.dot(a, wu)
        if FP8:
            rows = scale_ptr + expert * 2 * INTER + offs_n
            acc_g = acc_g * tl.load(rows, mask=nmask, other=0.0)[None, :]
            acc_u = acc_u * tl.load(rows + INTER, mask=nmask, other=0.0)[None, :]
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        tl.store(
            out_ptr + pair[:, None] * stride_ot + offs_n[None, :],
            h.to(out_ptr.dtype.element_ty),
            mask=pmask[:, None] & nmask[None, :],
        )

    @triton.jit
    def _moe_down_kernel(
        h_ptr,
        w_ptr,
        out_ptr,
        sorted_ptr,
        block_expert_ptr,
        weight_ptr,
        scale_ptr,
        num_pairs,
        stride_ht,
        stride_we,
        stride_wn,
        stride_ot,
        HIDDEN: tl.constexpr,
        INTER: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        IEEE: tl.constexpr,
        FP8: tl.constexpr,
    ):
        """out[pair] = routing_weight[pair] * (h[pair] @ down[e].T), one slice of HIDDEN
        (FP8 experts: times ``scale[e, row]``)."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        if expert < 0:
            return
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_ptr + offs_m).to(tl.int64)
        pmask = pair < num_pairs
        safe = tl.where(pmask, pair, 0)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < HIDDEN
        w_base = w_ptr + expert * stride_we
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            kmask = offs_k < INTER
            a = tl.load(
                h_ptr + safe[:, None] * stride_ht + offs_k[None, :],
                mask=pmask[:, None] & kmask[None, :],
                other=0.0,
            )
            w = tl.load(
                w_base + offs_n[None, :] * stride_wn + offs_k[:, None],
                mask=kmask[:, None] & nmask[None, :],
                other=0.0,
            )
            if FP8:
                w = w.to(a.dtype)
            if IEEE:
                acc += tl.dot(a, w, input_precision="ieee")
            else:
                acc += tl.dot(a, w)
        if FP8:
            acc = acc * tl.load(scale_ptr + expert * HIDDEN + offs_n, mask=nmask, other=0.0)[None, :]
        route = tl.load(weight_ptr + safe, mask=pmask, other=0.0).to(tl.float32)
        tl.store(
            out_ptr + safe[:, None] * stride_ot + offs_n[None, :],
            (acc * route[:, None]).to(out_ptr.dtype.element_ty),
            mask=pmask[:, None] & nmask[None, :],
        )

_moe_route_kernel = _moe_router_kernel = _moe_align_kernel = None

if triton is not None:

    @triton.jit
    def _softmax_top_k(
        x, emask, offs_e, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
        RENORMALIZE: tl.constexpr,
    ):
        # Softmax in float32 over the experts, the top k by repeated argmax (the lowest id first
        # among equals), renormalized to sum to one: (weights, ids) as [BLOCK_K] vectors.
        p = tl.exp(x - tl.max(x, 0))
        p = p / tl.sum(p, 0)
        # NOTE: a graph's padding rows may hold garbage (NaN logits); a NaN never equals the
        # maximum, so it counts as 0 here and every chosen id stays a real expert.
        p = tl.where(p == p, p, 0.0)
        offs_k = tl.arange(0, BLOCK_K)
        chosen_w = tl.zeros([BLOCK_K], tl.float32)
        chosen_i = tl.zeros([BLOCK_K], tl.int32)
        left = tl.where(emask, p, -1.0)
        for j in tl.static_range(TOP_K):
            best = tl.max(left, 0)
            idx = tl.min(tl.where(left == best, offs_e, BLOCK_E), 0)
            chosen_w = tl.where(offs_k == j, best, chosen_w)
            chosen_i = tl.where(offs_k == j, idx, chosen_i)
            left = tl.where(offs_e == idx, -2.0, left)
        if RENORMALIZE:  # (a garbage row's weights are all 0: divided by 1e-30, they stay 0)
            chosen_w = chosen_w / tl.maximum(tl.sum(chosen_w, 0), 1e-30)
        return chosen_w, chosen_i

    @triton.jit
    def _moe_route_kernel(
        logits_ptr, weights_ptr, ids_ptr, stride_l, NUM_EXPERTS: tl.constexpr,
        TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
        RENORMALIZE: tl.constexpr,
    ):
        # One token: its logits' softmax and top k (_softmax_top_k).
        t = tl.program_id(0).to(tl.int64)
        offs_e = tl.arange(0, BLOCK_E)
        emask = offs_e < NUM_EXPERTS
        x = tl.load(logits_ptr + t * stride_l + offs_e, mask=emask, other=float("-inf"))
        chosen_w, chosen_i = _softmax_top_k(x.to(tl.float32), emask, offs_e, TOP_K, BLOCK_K,
                                            BLOCK_E, RENORMALIZE)
        offs_k = tl.arange(0, BLOCK_K)
        kmask = offs_k < TOP_K
        tl.store(weights_ptr + t * TOP_K + offs_k, chosen_w.to(weights_ptr.dtype.element_ty),
                 mask=kmask)
        tl.store(ids_ptr + t * TOP_K + offs_k, chosen_i.to(ids_ptr.dtype.element_ty), mask=kmask)

    @triton.jit
    def _moe_router_kernel(
        x_ptr, w_ptr, logits_ptr, counter_ptr, weights_ptr, ids_ptr, stride_xt, stride_wn,
        HIDDEN: tl.constexpr, NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
        BLOCK_E: tl.constexpr, RENORMALIZE: tl.constexpr,
    ):
        # The router's logits and the top k in one launch. Program (t, r) computes BLOCK_R
        # logits of token t (rounded to the input's dtype, as the router's linear layer gives
        # them) into the float32 scratch row; the last of the token's programs to finish
        # (counted on counter[t]) routes the whole row and sets the counter back to 0.
        t = tl.program_id(0).to(tl.int64)
        offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = offs_r < NUM_EXPERTS
        rows = tl.minimum(offs_r, NUM_EXPERTS - 1).to(tl.int64)
        acc = tl.zeros([BLOCK_R, BLOCK_H], tl.float32)
        for h0 in range(0, HIDDEN, BLOCK_H):
            offs_h = h0 + tl.arange(0, BLOCK_H)
            hmask = offs_h < HIDDEN
            a = tl.load(x_ptr + t * stride_xt + offs_h, mask=hmask, other=0.0)
            w = tl.load(w_ptr + rows[:, None] * stride_wn + offs_h[None, :], mask=hmask[None, :],
                        other=0.0)
            acc += w.to(tl.float32) * a.to(tl.float32)[None, :]
        logit = tl.sum(acc, axis=1).to(x_ptr.dtype.element_ty).to(tl.float32)
        tl.store(logits_ptr + t * NUM_EXPERTS + offs_r, logit, mask=rmask)
        # NOTE: every thread's store is ordered before the count by the barrier and the
        # release of the (one-thread) atomic; the last program's acquire and volatile loads
        # then see all of the row.
        tl.debug_barrier()
        done = tl.atomic_add(counter_ptr + t, 1, sem="acq_rel", scope="gpu")
        if done == tl.num_programs(1) - 1:
            offs_e = tl.arange(0, BLOCK_E)
            emask = offs_e < NUM_EXPERTS
            x = tl.load(logits_ptr + t * NUM_EXPERTS + offs_e, mask=emask, other=float("-inf"),
                        volatile=True)
            chosen_w, chosen_i = _softmax_top_k(x, emask, offs_e, TOP_K, BLOCK_K, BLOCK_E,
                                                RENORMALIZE)
            offs_k = tl.arange(0, BLOCK_K)
            kmask = offs_k < TOP_K
            tl.store(weights_ptr + t * TOP_K + offs_k,
                     chosen_w.to(weights_ptr.dtype.element_ty), mask=kmask)
            tl.store(ids_ptr + t * TOP_K + offs_k, chosen_i.to(ids_ptr.dtype.element_ty),
                     mask=kmask)
            tl.atomic_xchg(counter_ptr + t, 0, sem="relaxed", scope="gpu")

    @triton.jit
    def _moe_align_kernel(
        ids_ptr, sorted_ptr, block_expert_ptr, num_pairs, num_blocks,
        NUM_EXPERTS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr,
    ):
        # One program lays out every (token, expert) pair as ``moe.group_by_expert`` does, for
        # up to BLOCK_P pairs: pair i goes to its expert's padded run at the rank it has among
        # the pairs of that expert (stable), the rest of the layout holds num_pairs.
        offs_p = tl.arange(0, BLOCK_P)
        pmask = offs_p < num_pairs
        e = tl.load(ids_ptr + offs_p, mask=pmask, other=BLOCK_E)
        pmask = pmask & (e >= 0) & (e < NUM_EXPERTS)  # an id out of range lands nowhere
        e = tl.where(pmask, e, BLOCK_E).to(tl.int32)  # (checked before the narrowing)
        offs_e = tl.arange(0, BLOCK_E)
        mine = e[None, :] == offs_e[:, None]  # [experts, pairs]
        counts = tl.sum(mine.to(tl.int32), 1)
        padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        padded_end = tl.cumsum(padded, 0)
        start = padded_end - padded
        earlier = (e[:, None] == e[None, :]) & (offs_p[None, :] < offs_p[:, None])
        rank = tl.sum(earlier.to(tl.int32), 1)
        dest = tl.sum(tl.where(mine, start[:, None], 0), 0) + rank
        for q0 in range(0, num_blocks * BLOCK_M, BLOCK_P):
            q = q0 + offs_p
            tl.store(sorted_ptr + q, tl.zeros([BLOCK_P], tl.int64) + num_pairs,
                     mask=q < num_blocks * BLOCK_M)
        # NOTE: the fill above and the scatter below may touch one slot from two threads.
        tl.debug_barrier()
        tl.store(sorted_ptr + dest, offs_p.to(tl.int64), mask=pmask)
        offs_b = tl.arange(0, BLOCK_B)
        real = offs_e < NUM_EXPERTS
        owner = tl.sum(((padded_end[None, :] <= offs_b[:, None] * BLOCK_M) & real[None, :])
                       .to(tl.int32), 1)
        owner = tl.where(owner < NUM_EXPERTS, owner, -1)
        tl.store(block_expert_ptr + offs_b, owner.to(block_expert_ptr.dtype.element_ty),
                 mask=offs_b < num_blocks)
