"""The CUDA C++ source of the bulk-copy GEMV (``bulk_gemv``): ``out = W x`` for one row ``x``
[K] and a row-major weight ``W`` [N, K] in bfloat16, or in e4m3 with one float32 scale per row
(``BG_FP8``), compiled by NVRTC for Hopper (sm_90+).

Block ``b`` of ``G`` owns rows ``[b N / G, (b + 1) N / G)``: one contiguous range of the weight.
One thread streams it into a ring of ``BG_STAGES`` shared-memory stages of ``BG_ROWS`` rows with
``cp.async.bulk`` copies, each stage completing an mbarrier; every thread computes dot products
out of the stages as they land, and the stage goes back to the copier once every thread is past
it. The first stages are requested before ``griddepcontrol.wait``: weights do not depend on the
kernel before, so under a programmatic dependent launch they stream while that kernel ends.

Only after the wait does a block read the input, transformed into shared memory (``BG_MODE``):
0 as is; 1 the decoder's (residual add +) RMSNorm, with the RMSNorm kernel's arithmetic (the sum
of squares added in ``rms_norm_kernels``' fixed order, so the normalized row has that kernel's
bits; block 0 writes the new residual); 2 SwiGLU of ``[gate | up]`` (``x`` is [2K]).

With e4m3 weights the products are f16 pairs (``fma.rn.f16x2``, eight products a lane summed
in f16, then in float32): float32 products would cost several times the integer and conversion
work per byte, and the kernel is bound by that work rather than by the weight stream. Each
weight pair becomes f16 by integer operations (2^-8 times its value, exact) or, with
``BG_CVT``, by the hardware conversion (``cvt.rn.f16x2.e4m3x2``, its value); the input row is
copied to f16 times the power of two ``2^s`` that brings its largest element below 2^11 (2^4
with ``BG_CVT``; exact where it stays in f16's normal range; eight products then stay below
2^15, or 57344, under f16's largest 65504), in two
planes (plane ``p`` holds elements ``16 v + 8 p .. 16 v + 8 p + 7`` at index ``v``: a warp's
loads of a plane are consecutive, no bank conflicts); the output is the sum times the row's
scale, 2^8 (without ``BG_CVT``) and 2^-s.

Thread ``t`` of a stage takes row ``t / (T / BG_ROWS)`` and every ``T / BG_ROWS``-th 16-byte
vector of it; each row's sum is reduced with warp shuffles (and across warps through shared
memory where a row has more than 32 threads), so an output's bits depend on the configuration
but not on timing: a graph replay and an eager call agree.
"""

from __future__ import annotations

__all__ = ["PRELUDE", "SOURCE", "KERNEL", "NORM_LANES", "defines", "shared_bytes",
           "x_in_registers"]

KERNEL = "bulk_gemv"
NORM_LANES = 512  # rms_norm_kernels.NORM_CHUNK_MAX: the sum of squares' lanes
_HEADER = 384  # mbarriers (<= 8 stages) and the reduction scratch, before the input row


def _round(n: int, to: int = 128) -> int:
    return -(-n // to) * to


def shared_bytes(k: int, rows: int, stages: int, fp8: bool = False) -> int:
    """Dynamic shared memory of one block: header, the input row (bf16; with e4m3 weights
    also scaled into f16), the stages."""
    if fp8:
        return _HEADER + 2 * _round(2 * k) + stages * rows * k
    return _HEADER + _round(2 * k) + stages * rows * 2 * k


def x_in_registers(k: int, rows: int, threads: int) -> bool:
    """Whether an e4m3 launch keeps each thread's part of the input in registers (compiled for
    its K): every thread of a row then takes the same number of 16-byte vectors, at most 8."""
    vectors, tpr = k // 16, threads // rows
    return k % 16 == 0 and vectors % tpr == 0 and vectors // tpr <= 8


def defines(rows: int, stages: int, threads: int, mode: int, has_res: bool,
            fp8: bool = False, k: int = 0, hw_cvt: bool = False) -> list[str]:
    """The NVRTC options that specialize ``SOURCE``: rows per stage, stages, threads per
    block, mode (0 plain, 1 norm, 2 SwiGLU), whether the norm adds a residual first, whether
    the weight is e4m3, (e4m3, where ``x_in_registers``) K, and (e4m3) whether weight pairs
    become f16 by the hardware conversion."""
    regs = k if fp8 and k and x_in_registers(k, rows, threads) else 0
    return [f"-DBG_ROWS={rows}", f"-DBG_STAGES={stages}", f"-DBG_THREADS={threads}",
            f"-DBG_MODE={mode}", f"-DBG_HAS_RES={int(has_res)}", f"-DBG_FP8={int(fp8)}",
            f"-DBG_K={regs}", f"-DBG_CVT={int(fp8 and hw_cvt)}"]


PRELUDE = r"""
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float lo_bf(u32 v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float hi_bf(u32 v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ float bf(u16 v) { return __uint_as_float(((u32)v) << 16); }
__device__ __forceinline__ u16 to_bf(float f) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}
__device__ __forceinline__ float round_bf(float f) { return bf(to_bf(f)); }
__device__ __forceinline__ u32 smem_u32(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done = 0;
    while (!done) {
        asm volatile("{\n .reg .pred p;\n"
                     " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    }
}
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// SwiGLU as fused_ops.silu_and_mul rounds it: silu(g) rounded, then times up, rounded.
__device__ __forceinline__ u16 silu_mul(u16 gate, u16 up) {
    float g = bf(gate);
    float act = round_bf(g / (1.0f + __expf(-g)));
    return to_bf(act * bf(up));
}

// Bytes 0, 1 (lo) or 2, 3 (hi) of four e4m3 values as two f16 of 2^-8 times their value: the
// sign stays on top, exponent and mantissa move down one bit into f16's (bias 15 against 7).
__device__ __forceinline__ u32 e4m3_lo(u32 v) {
    u32 t = __byte_perm(v, 0u, 0x1404);
    return (t & 0x80008000u) | ((t >> 1) & 0x3f803f80u);
}
__device__ __forceinline__ u32 e4m3_hi(u32 v) {
    u32 t = __byte_perm(v, 0u, 0x3424);
    return (t & 0x80008000u) | ((t >> 1) & 0x3f803f80u);
}

__device__ __forceinline__ u32 pack(u16 lo, u16 hi) { return (u32)lo | ((u32)hi << 16); }
__device__ __forceinline__ u32 silu_mul2(u32 g, u32 u) {
    return pack(silu_mul((u16)(g & 0xffffu), (u16)(u & 0xffffu)),
                silu_mul((u16)(g >> 16), (u16)(u >> 16)));
}
__device__ __forceinline__ u16 to_h(float f) {
    u16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}
// The larger of m and the magnitudes of v's two bf16; v's two bf16 times s, as two f16.
__device__ __forceinline__ float amax2(u32 v, float m) {
    return fmaxf(m, fmaxf(fabsf(lo_bf(v)), fabsf(hi_bf(v))));
}
__device__ __forceinline__ u32 to_h2(u32 v, float s) {
    return pack(to_h(lo_bf(v) * s), to_h(hi_bf(v) * s));
}
// A sum of squares in the RMSNorm kernel's order: a thread's L lanes pairwise, level by level,
// then the warp's threads by xor shuffles (fold_lanes); then the W warps' sums pairwise
// (fold_warps).
template <int L>
__device__ __forceinline__ float fold_lanes(float (&lanes)[L]) {
    #pragma unroll
    for (int width = L; width > 1; width /= 2) {
        #pragma unroll
        for (int l = 0; l < width / 2; l++) lanes[l] = lanes[2 * l] + lanes[2 * l + 1];
    }
    float ss = lanes[0];
    #pragma unroll
    for (int off = 1; off < 32; off *= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    return ss;
}
template <int W>
__device__ __forceinline__ float fold_warps(float (&v)[W]) {
    #pragma unroll
    for (int width = W; width > 1; width /= 2) {
        #pragma unroll
        for (int i = 0; i < width / 2; i++) v[i] = v[2 * i] + v[2 * i + 1];
    }
    return v[0];
}
// RMSNorm's scaling as the RMSNorm kernel rounds it: s * rstd rounded, times w, rounded.
__device__ __forceinline__ u32 norm2(u32 s, u32 w, float rstd) {
    return pack(to_bf(round_bf(lo_bf(s) * rstd) * lo_bf(w)),
                to_bf(round_bf(hi_bf(s) * rstd) * hi_bf(w)));
}

"""

SOURCE = PRELUDE + r"""
// BG_ROWS rows per stage, BG_STAGES stages, BG_THREADS threads, BG_MODE (0 plain, 1 norm,
// 2 SwiGLU), BG_HAS_RES (mode 1: a residual is added first), BG_FP8 (e4m3 weights).
#define TPR (BG_THREADS / BG_ROWS)
#define WB (BG_FP8 ? 1 : 2)
#if BG_K
#define XV (BG_K / 16 / TPR)  // input vectors a thread holds
#endif
#define WARPS (BG_THREADS / 32)
#define HEADER 384
#define NORM_LANES 512
#define LPT (NORM_LANES / BG_THREADS)
#define COPY_CHUNK 16384u

__device__ __forceinline__ float dot4(u32 w0, u32 w1, u32 x0, u32 x1, float acc) {
    acc = fmaf(lo_bf(w0), lo_bf(x0), acc);
    acc = fmaf(hi_bf(w0), hi_bf(x0), acc);
    acc = fmaf(lo_bf(w1), lo_bf(x1), acc);
    return fmaf(hi_bf(w1), hi_bf(x1), acc);
}

// Two f16 (the low and high halves of v) as float32.
__device__ __forceinline__ float2 f16x2_f32(u32 v) {
    float a, b;
    asm("{\n .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n"
        " cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}" : "=f"(a), "=f"(b) : "r"(v));
    return make_float2(a, b);
}

__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

#if BG_CVT
#define XLOG2 4  // the f16 input below 2^4: eight products of e4m3 (<= 448) below 57344
#define WMUL 1.0f
#else
#define XLOG2 11  // below 2^11: eight products of 2^-8 e4m3 (<= 1.75) below 2^15
#define WMUL 256.0f
#endif

// acc + four e4m3 weights (one word, as f16: of 2^-8 times their value, or with BG_CVT of
// their value) times four f16 inputs (x01: the first two, x23: the last two), pair by pair.
__device__ __forceinline__ u32 dot4_e4m3(u32 w, u32 x01, u32 x23, u32 acc) {
#if BG_CVT
    u32 lo, hi;
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
        " cvt.rn.f16x2.e4m3x2 %1, h;\n}" : "=r"(lo), "=r"(hi) : "r"(w));
    return hfma2(hi, x23, hfma2(lo, x01, acc));
#else
    return hfma2(e4m3_hi(w), x23, hfma2(e4m3_lo(w), x01, acc));
#endif
}

// a0, a1 + one 16-byte vector of e4m3 weights times its 16 f16 inputs (x0: the first eight,
// from plane 0; x1: the last eight, from plane 1): eight products a lane in f16, then float32.
__device__ __forceinline__ void dot16_e4m3(uint4 w, uint4 x0, uint4 x1, float& a0, float& a1) {
    u32 h = dot4_e4m3(w.x, x0.x, x0.y, 0u);
    h = dot4_e4m3(w.y, x0.z, x0.w, h);
    h = dot4_e4m3(w.z, x1.x, x1.y, h);
    h = dot4_e4m3(w.w, x1.z, x1.w, h);
    const float2 f = f16x2_f32(h);
    a0 += f.x;
    a1 += f.y;
}

// Stage i of this block's rows: rows [first + i * BG_ROWS, ...), at most BG_ROWS of them.
__device__ __forceinline__ void issue(const unsigned char* w, long first, int rows_left, int i,
                                      int k, u32 stages, u32 bars) {
    int slot = i % BG_STAGES;
    int rows = min(BG_ROWS, rows_left - i * BG_ROWS);
    u32 bytes = (u32)rows * (u32)k * WB;
    u32 bar = bars + 8u * slot;
    u32 dst = stages + (u32)slot * (u32)(BG_ROWS * k * WB);
    const char* src = (const char*)(w + (first + (long)i * BG_ROWS) * (long)k * WB);
    mbar_expect(bar, bytes);
    for (u32 off = 0; off < bytes; off += COPY_CHUNK) {
        bulk_copy(dst + off, src + off, min(COPY_CHUNK, bytes - off), bar);
    }
}

// A row's sum as the output: with e4m3 weights times the row's scale, the 2^8 of the
// weights' f16 form (WMUL) and the 2^-xexp of the input's.
__device__ __forceinline__ float scaled(float sum, float wsc, int xexp) {
#if BG_FP8
    return ldexpf(sum * wsc * WMUL, -xexp);
#else
    return sum;
#endif
}

extern "C" __global__ void __launch_bounds__(BG_THREADS) bulk_gemv(
    const unsigned char* __restrict__ w, const u16* __restrict__ x, const u16* __restrict__ res,
    const u16* __restrict__ nw, const float* __restrict__ wscale, u16* __restrict__ out,
    u16* __restrict__ res_out, int n, int k, float eps)
{
    extern __shared__ __align__(128) unsigned char smem[];
    float* red = (float*)(smem + 64);  // 2 * WARPS floats, then 1 (the norm's scale)
    u16* xs = (u16*)(smem + HEADER);
    u16* xh = (u16*)(smem + HEADER + ((2 * k + 127) / 128) * 128);  // BG_FP8: two f16 planes
    unsigned char* st = (unsigned char*)xh + (BG_FP8 ? ((2 * k + 127) / 128) * 128 : 0);
    const u32 bars = smem_u32(smem);
    const u32 stages = smem_u32(st);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long first = (long)blockIdx.x * n / gridDim.x;
    const int my_rows = (int)((long)(blockIdx.x + 1) * n / gridDim.x - first);
    const int count = (my_rows + BG_ROWS - 1) / BG_ROWS;

    if (tid == 0) {
        for (int s = 0; s < BG_STAGES; s++) mbar_init(bars + 8u * s, 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (tid == 0) {
        for (int i = 0; i < min(BG_STAGES, count); i++) issue(w, first, my_rows, i, k, stages, bars);
    }
    // NOTE: nothing above reads memory an earlier kernel writes; everything below may.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

#if BG_MODE == 0
    #pragma unroll 4
    for (int v = tid; v < k / 8; v += BG_THREADS) ((uint4*)xs)[v] = ((const uint4*)x)[v];
#elif BG_MODE == 2
    // NOTE: vector loads, unrolled, so that several are in flight: each round trip to L2 that
    // this prologue waits for serially adds to the kernel (the weights are streaming meanwhile).
    #pragma unroll 4
    for (int v = tid; v < k / 8; v += BG_THREADS) {
        uint4 g = ((const uint4*)x)[v], u = ((const uint4*)x)[k / 8 + v];
        ((uint4*)xs)[v] = make_uint4(silu_mul2(g.x, u.x), silu_mul2(g.y, u.y),
                                     silu_mul2(g.z, u.z), silu_mul2(g.w, u.w));
    }
#else
    {
        // The new residual s = x (+ res), rounded; lane j of NORM_LANES adds the squares of
        // s[j], s[j + NORM_LANES], ... in order; lanes are then added pairwise, level by level.
        float lanes[LPT];
        #pragma unroll
        for (int l = 0; l < LPT; l++) lanes[l] = 0.0f;
        #pragma unroll 8
        for (int c = 0; c < k; c += NORM_LANES) {
            #pragma unroll
            for (int l = 0; l < LPT; l++) {
                int i = c + tid * LPT + l;
                if (i < k) {
                    float s = bf(x[i]);
#if BG_HAS_RES
                    u16 sb = to_bf(s + bf(res[i]));
                    s = bf(sb);
                    xs[i] = sb;
                    if (blockIdx.x == 0) res_out[i] = sb;
#else
                    xs[i] = x[i];
#endif
                    lanes[l] = fmaf(s, s, lanes[l]);
                }
            }
        }
        const float ss = fold_lanes(lanes);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        if (tid == 0) {
            float v[WARPS];
            #pragma unroll
            for (int i = 0; i < WARPS; i++) v[i] = red[i];
            red[2 * WARPS] = rsqrtf(__fdiv_rn(fold_warps(v), (float)k) + eps);
        }
        __syncthreads();
        const float rstd = red[2 * WARPS];
        #pragma unroll 4
        for (int v = tid; v < k / 8; v += BG_THREADS) {
            uint4 a = ((uint4*)xs)[v], b = ((const uint4*)nw)[v];
            ((uint4*)xs)[v] = make_uint4(norm2(a.x, b.x, rstd), norm2(a.y, b.y, rstd),
                                         norm2(a.z, b.z, rstd), norm2(a.w, b.w, rstd));
        }
    }
#endif
    __syncthreads();
    int xexp = 0;  // BG_FP8: the input's f16 copy is 2^xexp times it
#if BG_FP8
    {
        float mx = 0.0f;
        #pragma unroll 4
        for (int v = tid; v < k / 8; v += BG_THREADS) {
            uint4 a = ((const uint4*)xs)[v];
            mx = amax2(a.w, amax2(a.z, amax2(a.y, amax2(a.x, mx))));
        }
        #pragma unroll
        for (int off = 1; off < 32; off *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        if (lane == 0) red[warp] = mx;
        __syncthreads();
        if (tid == 0) {
            for (int i = 1; i < WARPS; i++) mx = fmaxf(mx, red[i]);
            int e = (int)((__float_as_uint(mx) >> 23) & 0xffu) - 127;  // max < 2^(e + 1)
            red[2 * WARPS + 1] = __int_as_float(min(max(XLOG2 - 1 - e, -126), 126));
        }
        __syncthreads();
        xexp = __float_as_int(red[2 * WARPS + 1]);
        const float sc = __uint_as_float((u32)(127 + xexp) << 23);
        const int planes = k / 16;
        #pragma unroll 2
        for (int v = tid; v < planes; v += BG_THREADS) {
            uint4 a = ((const uint4*)xs)[2 * v], b = ((const uint4*)xs)[2 * v + 1];
            ((uint4*)xh)[v] = make_uint4(to_h2(a.x, sc), to_h2(a.y, sc), to_h2(a.z, sc),
                                         to_h2(a.w, sc));
            ((uint4*)xh)[planes + v] = make_uint4(to_h2(b.x, sc), to_h2(b.y, sc),
                                                  to_h2(b.z, sc), to_h2(b.w, sc));
        }
    }
    __syncthreads();
#endif

    const int row = tid / TPR, part = tid % TPR;
    // The row whose output this thread writes (if any): a row's first thread, or with more
    // than a warp per row thread t for row t.
    const int wrow = TPR > 32 ? (tid < BG_ROWS ? tid : BG_ROWS) : (part == 0 ? row : BG_ROWS);
    const uint4* xv = (const uint4*)xs;
#if BG_FP8 && BG_K
    // NOTE: a thread reads the same input vectors for every row: held in registers, the main
    // loop's shared-memory reads are the weights' alone.
    uint4 xr[XV], yr[XV];
    #pragma unroll
    for (int j = 0; j < XV; j++) {
        xr[j] = ((const uint4*)xh)[part + j * TPR];
        yr[j] = ((const uint4*)xh)[BG_K / 16 + part + j * TPR];
    }
#endif
    for (int i = 0; i < count; i++) {
        const int slot = i % BG_STAGES;
        const int rows = min(BG_ROWS, my_rows - i * BG_ROWS);
        const long r0 = first + (long)i * BG_ROWS;
        float wsc = 1.0f;
#if BG_FP8
        // NOTE: the row scale is loaded before the stage's wait, its latency hidden by the
        // products: loaded at the end, it held every stage's hand-back to the copier.
        if (wrow < rows) wsc = __ldg(wscale + r0 + wrow);
#endif
        mbar_wait(bars + 8u * slot, (u32)((i / BG_STAGES) & 1));
        float a0 = 0.0f, a1 = 0.0f;
        if (row < rows) {
            const uint4* wv = (const uint4*)(st + ((long)slot * BG_ROWS + row) * k * WB);
#if BG_FP8 && BG_K
            #pragma unroll
            for (int j = 0; j < XV; j++) dot16_e4m3(wv[part + j * TPR], xr[j], yr[j], a0, a1);
#elif BG_FP8
            const uint4* xp = (const uint4*)xh;
            const int planes = k / 16;
            #pragma unroll 2
            for (int v = part; v < planes; v += TPR) {
                dot16_e4m3(wv[v], xp[v], xp[planes + v], a0, a1);
            }
#else
            #pragma unroll 4
            for (int v = part; v < k / 8; v += TPR) {
                uint4 a = wv[v], b = xv[v];
                a0 = dot4(a.x, a.y, b.x, b.y, a0);
                a1 = dot4(a.z, a.w, b.z, b.w, a1);
            }
#endif
        }
        float acc = a0 + a1;
        #pragma unroll
        for (int off = (TPR < 32 ? TPR : 32) / 2; off > 0; off /= 2) {
            acc += __shfl_xor_sync(0xffffffffu, acc, off);
        }
        float* parts = red + (i & 1) * WARPS;
#if TPR > 32
        if (lane == 0) parts[warp] = acc;
#else
        if (part == 0 && row < rows) out[r0 + row] = to_bf(scaled(acc, wsc, xexp));
#endif
        __syncthreads();  // every thread is past the stage: it goes back to the copier
        if (tid == 0 && i + BG_STAGES < count) issue(w, first, my_rows, i + BG_STAGES, k, stages, bars);
#if TPR > 32
        if (tid < rows) {
            float sum = 0.0f;
            #pragma unroll
            for (int j = 0; j < TPR / 32; j++) sum += parts[tid * (TPR / 32) + j];
            out[r0 + tid] = to_bf(scaled(sum, wsc, xexp));
        }
#endif
    }
}
"""
