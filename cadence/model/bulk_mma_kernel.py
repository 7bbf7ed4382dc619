"""The CUDA C++ source of the tensor-core bulk GEMM (``bulk_mma``): ``out = x W^T`` for up to 8
rows ``x`` [M, K] and a row-major weight ``W`` [N, K] in bfloat16, or in e4m3 with one float32
scale per output row; compiled by NVRTC for Hopper (sm_90+).

As in the one-row ``bulk_gemv``: block ``b`` of ``G`` owns rows ``[b N / G, (b + 1) N / G)``, one
thread streams them with ``cp.async.bulk`` copies into a ring of ``BM_STAGES`` shared-memory
stages (requested before ``griddepcontrol.wait``, so that they stream while the kernel before
ends), and the input row(s) are read, with the decoder's (residual add +) RMSNorm or SwiGLU
applied (``BM_MODE``), only after the wait. A stage is ``BM_ROWS`` weight rows (16 or 32) by
``BM_KC`` columns, each row copied to a padded slot (no bank conflicts in the loads below).

The products run on the tensor cores (``mma.m16n8k16``): weight rows are the 16-row A tiles, the
input rows the 8 columns of B (columns past M are zeros). Each lane loads 16 contiguous bytes of
an A row and the matching elements of its B column; which of the MMA's k positions an element
takes does not matter to a dot product as long as A and B agree, so no shuffle is needed. Warps
split a stage's columns; at a row group's last stage their sums are added in warp order (an
output's bits depend on the configuration, not on timing).

e4m3 weights become f16 with three integer operations per pair (sign, then exponent and
mantissa shifted: the value times 2^-8, subnormals included); the input rows are then held in
f16 too, each scaled by a power of two that keeps its largest element below 2^15 (exact but for
elements below 2^-24 of it), and every output is scaled back with the row's weight scale.
"""

from __future__ import annotations

from cadence.model.bulk_gemv_kernel import PRELUDE

__all__ = ["SOURCE", "KERNEL", "MAX_M", "NORM_LANES", "defines", "shared_bytes"]

KERNEL = "bulk_mma"
MAX_M = 8  # input rows: the MMA's B columns
NORM_LANES = 512  # rms_norm_kernels.NORM_CHUNK_MAX: the sum of squares' lanes
_HEADER = 1024  # mbarriers, the norm's partial sums and scales, before the input rows
_STAGE_PAD = 64  # bytes after each stage row: rows 16 lanes apart hit other banks


def _round(n: int, to: int = 128) -> int:
    return -(-n // to) * to


def x_row_bytes(k: int, fp8: bool) -> int:
    """Bytes between input rows in shared memory (2-byte elements, padded so that the rows
    eight lanes read at once fall on different banks)."""
    return _round(2 * k) + (16 if fp8 else 64)


def shared_bytes(m: int, k: int, rows: int, kc: int, stages: int, threads: int,
                 fp8: bool, padded: bool = True) -> int:
    """Dynamic shared memory of one block: header, the M input rows, the warps' partial
    sums, the stages."""
    width = min(kc, k) * (1 if fp8 else 2)
    stage_row = _round(width) + _STAGE_PAD if padded else width
    partials = 2 * (threads // 32) * 16 * MAX_M * 4  # two buffers: row groups alternate
    return _HEADER + _round(m * x_row_bytes(k, fp8)) + partials + stages * rows * stage_row


def defines(rows: int, kc: int, stages: int, threads: int, mode: int, has_res: bool,
            fp8: bool, padded: bool = True, max_rows: int = MAX_M) -> list[str]:
    """The NVRTC options that specialize ``SOURCE``; ``max_rows``: the row bucket a call's
    input rows fall in (the norm prologue's unrolled row count)."""
    if not 1 <= max_rows <= MAX_M:
        raise ValueError(f"max_rows must be 1 to {MAX_M}, got {max_rows}")
    return [f"-DBM_ROWS={rows}", f"-DBM_KC={kc}", f"-DBM_STAGES={stages}",
            f"-DBM_THREADS={threads}", f"-DBM_MODE={mode}", f"-DBM_HAS_RES={int(has_res)}",
            f"-DBM_FP8={int(fp8)}", f"-DBM_PAD={int(padded)}",
            f"-DBM_MR={max_rows if mode == 1 else MAX_M}"]


SOURCE = PRELUDE + r"""
typedef unsigned char u8;

#define WARPS (BM_THREADS / 32)
#define RG (BM_ROWS / 16)
#define KS (WARPS / RG)
#define WB (BM_FP8 ? 1 : 2)
#define CHUNK (BM_FP8 ? 64 : 32)
#define MAXM 8
#define HEADER 1024
#define NORM_LANES 512
#define LPT (NORM_LANES / BM_THREADS)
#define XPAD (BM_FP8 ? 16 : 64)

// c += A B for one 16x8x16 tile: a0/a2 row g, a1/a3 row g + 8; b0/b1 column g.
__device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if BM_FP8
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#endif
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 add2(u32 a, u32 b) {
    return pack(to_bf(lo_bf(a) + lo_bf(b)), to_bf(hi_bf(a) + hi_bf(b)));
}

// Stage i: row group i / nkc of this block's rows, column chunk i % nkc; each row to its slot.
__device__ __forceinline__ void issue(const u8* w, long first, int my_rows, int k, int nkc,
                                      int wrow, int i, u32 stages, u32 bars) {
    const int slot = i % BM_STAGES, grp = i / nkc, kc = i % nkc;
    const int rows = min(BM_ROWS, my_rows - grp * BM_ROWS);
    const u32 bytes = (u32)min(BM_KC, k - kc * BM_KC) * WB;
    const u32 bar = bars + 8u * slot;
    const u32 dst = stages + (u32)slot * (u32)(BM_ROWS * wrow);
    const u8* src = w + ((first + (long)grp * BM_ROWS) * (long)k + (long)kc * BM_KC) * WB;
    mbar_expect(bar, bytes * (u32)rows);
#if !BM_PAD
    if (nkc == 1) {  // whole rows, unpadded: the stage is one contiguous range
        const u32 total = bytes * (u32)rows;
        for (u32 off = 0; off < total; off += 32768u) {
            bulk_copy(dst + off, src + off, min(32768u, total - off), bar);
        }
        return;
    }
#endif
    for (int r = 0; r < rows; r++) {
        bulk_copy(dst + (u32)(r * wrow), src + (long)r * k * WB, bytes, bar);
    }
}

extern "C" __global__ void __launch_bounds__(BM_THREADS) bulk_mma(
    const u8* __restrict__ w, const float* __restrict__ wscale, const u16* __restrict__ x,
    const u16* __restrict__ res, const u16* __restrict__ nw, u16* __restrict__ out,
    u16* __restrict__ res_out, int m, int n, int k, float eps)
{
    extern __shared__ __align__(128) u8 smem[];
    float* part = (float*)(smem + 64);  // [MAXM][WARPS]: the norm's and the maxima's partials
    float* rstd = part + MAXM * WARPS;  // [MAXM]
    float* xmul = rstd + MAXM;  // [MAXM]: each input row's f16 scale back (2^8 2^s)
    const int xrow = ((2 * k + 127) / 128) * 128 + XPAD;  // bytes
    u8* xs = smem + HEADER;
    // [2][KS][ROWS][8]: the warps' sums of a row group; groups alternate between the two, so
    // that a group's sums are not overwritten while the one before is still being added up.
    float* red = (float*)(smem + HEADER + ((m * xrow + 127) / 128) * 128);
    u8* st = (u8*)(red + 2 * WARPS * 16 * MAXM);
    const u32 bars = smem_u32(smem);
    const u32 stages = smem_u32(st);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long first = (long)blockIdx.x * n / gridDim.x;
    const int my_rows = (int)((long)(blockIdx.x + 1) * n / gridDim.x - first);
    const int nkc = (k + BM_KC - 1) / BM_KC;
    const int count = (my_rows + BM_ROWS - 1) / BM_ROWS * nkc;
    // A stage row's bytes in shared memory: 64 past a multiple of 128, so that the 16-byte
    // loads of rows g and g + 1 (eight lanes at a time) fall on different banks.
    // (Unpadded, BM_PAD 0: two-way conflicts, against one copy per row.)
    const int wrow = BM_PAD ? ((min(BM_KC, k) * WB + 127) / 128) * 128 + 64 : min(BM_KC, k) * WB;

    if (tid == 0) {
        for (int s = 0; s < BM_STAGES; s++) mbar_init(bars + 8u * s, 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (tid == 0) {
        for (int i = 0; i < min(BM_STAGES, count); i++) {
            issue(w, first, my_rows, k, nkc, wrow, i, stages, bars);
        }
    }
    // NOTE: nothing above reads memory an earlier kernel writes; everything below may.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

    // The input rows, in bfloat16, each at xs + r * xrow. NOTE: the loops run over all rows
    // at once, unrolled, so that many loads are in flight (each round trip to L2 that this
    // prologue waits for serially adds to the kernel; the weights stream meanwhile).
    const int kv = k / 8;  // 16-byte vectors a row
#if BM_MODE == 0
    #pragma unroll 4
    for (int i = tid; i < m * kv; i += BM_THREADS) {
        const int r = i / kv, v = i - r * kv;
        ((uint4*)(xs + r * xrow))[v] = ((const uint4*)x)[i];
    }
#elif BM_MODE == 2
    #pragma unroll 4
    for (int i = tid; i < m * kv; i += BM_THREADS) {
        const int r = i / kv, v = i - r * kv;
        const uint4* xr = (const uint4*)(x + (long)r * 2 * k);
        uint4 g = xr[v], u = xr[kv + v];
        ((uint4*)(xs + r * xrow))[v] = make_uint4(silu_mul2(g.x, u.x), silu_mul2(g.y, u.y),
                                                  silu_mul2(g.z, u.z), silu_mul2(g.w, u.w));
    }
#else
    // The new residual s = x (+ res), rounded (block 0 writes it out).
    #pragma unroll 4
    for (int i = tid; i < m * kv; i += BM_THREADS) {
        const int r = i / kv, v = i - r * kv;
        uint4 a = ((const uint4*)x)[i];
#if BM_HAS_RES
        uint4 b = ((const uint4*)res)[i];
        a = make_uint4(add2(a.x, b.x), add2(a.y, b.y), add2(a.z, b.z), add2(a.w, b.w));
        if (blockIdx.x == 0) ((uint4*)res_out)[i] = a;
#endif
        ((uint4*)(xs + r * xrow))[v] = a;
    }
    __syncthreads();
    {
        // Lane j of NORM_LANES adds the squares of s[j], s[j + NORM_LANES], ... in order; lanes
        // are then added pairwise, level by level (the RMSNorm kernel's order, row by row).
        // NOTE: all BM_MR rows of the bucket in one unrolled pass (rows past m re-read row 0
        // and are dropped); row after row, the batch-8 decode step took 5% longer (run ZZC).
        float lanes[BM_MR][LPT];
        #pragma unroll
        for (int r = 0; r < BM_MR; r++) {
            #pragma unroll
            for (int l = 0; l < LPT; l++) lanes[r][l] = 0.0f;
        }
        for (int c = 0; c < k; c += NORM_LANES) {
            #pragma unroll
            for (int r = 0; r < BM_MR; r++) {
                const u16* sr = (const u16*)(xs + (r < m ? r : 0) * xrow);
                #pragma unroll
                for (int l = 0; l < LPT; l++) {
                    int i = c + tid * LPT + l;
                    float s = i < k ? bf(sr[i]) : 0.0f;
                    lanes[r][l] = fmaf(s, s, lanes[r][l]);
                }
            }
        }
        #pragma unroll
        for (int r = 0; r < BM_MR; r++) {
            const float ss = fold_lanes(lanes[r]);
            if (lane == 0 && r < m) part[r * WARPS + warp] = ss;
        }
    }
    __syncthreads();
    if (tid < m) {
        float v[WARPS];
        #pragma unroll
        for (int i = 0; i < WARPS; i++) v[i] = part[tid * WARPS + i];
        rstd[tid] = rsqrtf(__fdiv_rn(fold_warps(v), (float)k) + eps);
    }
    __syncthreads();
    #pragma unroll 4
    for (int i = tid; i < m * kv; i += BM_THREADS) {
        const int r = i / kv, v = i - r * kv;
        const float rs = rstd[r];
        uint4* sr = (uint4*)(xs + r * xrow);
        uint4 a = sr[v], b = ((const uint4*)nw)[v];
        sr[v] = make_uint4(norm2(a.x, b.x, rs), norm2(a.y, b.y, rs), norm2(a.z, b.z, rs),
                           norm2(a.w, b.w, rs));
    }
#endif
#if BM_FP8
    // Into f16, each row times the power of two 2^-s that brings its largest element into
    // [2^14, 2^15) (s clamped to [-100, 114]: zeros, and 2^-s a normal float).
    __syncthreads();
    for (int r = 0; r < m; r++) {
        float mx = 0.0f;
        const uint4* sr = (const uint4*)(xs + r * xrow);
        for (int v = tid; v < kv; v += BM_THREADS) {
            uint4 a = sr[v];
            mx = amax2(a.w, amax2(a.z, amax2(a.y, amax2(a.x, mx))));
        }
        #pragma unroll
        for (int off = 1; off < 32; off *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        if (lane == 0) part[r * WARPS + warp] = mx;
    }
    __syncthreads();
    if (tid < m) {
        float mx = 0.0f;
        for (int i = 0; i < WARPS; i++) mx = fmaxf(mx, part[tid * WARPS + i]);
        int e = (int)((__float_as_uint(mx) >> 23) & 0xffu) - 127;  // floor(log2(max))
        int s = min(max(e - 14, -100), 114);
        rstd[tid] = __uint_as_float((u32)(127 - s) << 23);  // 2^-s
        xmul[tid] = __uint_as_float((u32)(127 + 8 + s) << 23);  // 2^8 (the weights) 2^s
    }
    __syncthreads();
    #pragma unroll 4
    for (int i = tid; i < m * kv; i += BM_THREADS) {
        const int r = i / kv, v = i - r * kv;
        const float sc = rstd[r];
        uint4* sr = (uint4*)(xs + r * xrow);
        uint4 a = sr[v];
        sr[v] = make_uint4(to_h2(a.x, sc), to_h2(a.y, sc), to_h2(a.z, sc), to_h2(a.w, sc));
    }
#endif
    __syncthreads();

    const int g = lane >> 2, t = lane & 3;
    const int rg = warp % RG, ks = warp / RG;
    const u8* xg = xs + (g < m ? g : 0) * xrow;  // lanes past M load nothing
    const int orow = tid >> 3, ocol = tid & 7;  // the output this thread writes at a group's end
    float c0[4], c1[4], wsc = 1.0f;
    for (int i = 0; i < count; i++) {
        const int slot = i % BM_STAGES, grp = i / nkc, kc = i % nkc;
        const int rows = min(BM_ROWS, my_rows - grp * BM_ROWS);
        const int cols = min(BM_KC, k - kc * BM_KC);
        if (kc == 0) {
            #pragma unroll
            for (int j = 0; j < 4; j++) c0[j] = c1[j] = 0.0f;
#if BM_FP8
            // Read before the stage's wait: the load's latency hides behind the products.
            if (orow < rows) wsc = wscale[first + (long)grp * BM_ROWS + orow];
#endif
        }
        mbar_wait(bars + 8u * slot, (u32)((i / BM_STAGES) & 1));
        const u8* alo = st + (slot * BM_ROWS + rg * 16 + g) * wrow + 16 * t;
        const u8* ahi = alo + 8 * wrow;
        for (int ch = ks; ch < cols / CHUNK; ch += KS) {
            const uint4 wl = *(const uint4*)(alo + ch * CHUNK * WB);
            const uint4 wh = *(const uint4*)(ahi + ch * CHUNK * WB);
            const int kk = kc * BM_KC + ch * CHUNK;  // the chunk's first column
#if BM_FP8
            uint4 x0 = make_uint4(0u, 0u, 0u, 0u), x1 = x0;
            if (g < m) {
                x0 = *(const uint4*)(xg + 2 * (kk + 16 * t));
                x1 = *(const uint4*)(xg + 2 * (kk + 16 * t) + 16);
            }
            mma(c0, e4m3_lo(wl.x), e4m3_lo(wh.x), e4m3_hi(wl.x), e4m3_hi(wh.x), x0.x, x0.y);
            mma(c1, e4m3_lo(wl.y), e4m3_lo(wh.y), e4m3_hi(wl.y), e4m3_hi(wh.y), x0.z, x0.w);
            mma(c0, e4m3_lo(wl.z), e4m3_lo(wh.z), e4m3_hi(wl.z), e4m3_hi(wh.z), x1.x, x1.y);
            mma(c1, e4m3_lo(wl.w), e4m3_lo(wh.w), e4m3_hi(wl.w), e4m3_hi(wh.w), x1.z, x1.w);
#else
            uint4 xv = make_uint4(0u, 0u, 0u, 0u);
            if (g < m) xv = *(const uint4*)(xg + 2 * (kk + 8 * t));
            mma(c0, wl.x, wh.x, wl.y, wh.y, xv.x, xv.y);
            mma(c1, wl.z, wh.z, wl.w, wh.w, xv.z, xv.w);
#endif
        }
        const bool last = kc == nkc - 1;
        float* sums = red + (grp & 1) * WARPS * 16 * MAXM;
        if (last) {
            // c[0], c[1]: row g, columns 2t, 2t + 1; c[2], c[3]: row g + 8.
            float* r = sums + (ks * BM_ROWS + rg * 16 + g) * MAXM + 2 * t;
            r[0] = c0[0] + c1[0];
            r[1] = c0[1] + c1[1];
            r[8 * MAXM] = c0[2] + c1[2];
            r[8 * MAXM + 1] = c0[3] + c1[3];
        }
        __syncthreads();  // every thread is past the stage: it goes back to the copier
        if (tid == 0 && i + BM_STAGES < count) {
            issue(w, first, my_rows, k, nkc, wrow, i + BM_STAGES, stages, bars);
        }
        if (last && orow < rows && ocol < m) {
            float sum = 0.0f;
            #pragma unroll
            for (int j = 0; j < KS; j++) sum += sums[(j * BM_ROWS + orow) * MAXM + ocol];
#if BM_FP8
            sum = sum * xmul[ocol] * wsc;
#endif
            out[(long)ocol * n + first + (long)grp * BM_ROWS + orow] = to_bf(sum);
        }
    }
}
"""
