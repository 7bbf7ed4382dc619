"""Where a bulk-GEMM call's time goes, phase by phase (GPU): the kernel built with global-timer
stamps in every block, run back to back in a CUDA graph as the decode step chains it.

    python scripts/bulk_mma_phases.py [--rows 1,2,4,8] [--shapes qkv,o,gate_up,down]
        [--variants engine,late,nores,serial] [--calls 200] [--json FILE]

The stamps (``%globaltimer``, ns) are taken by thread 0 of each block of the chain's last call:
T0 at the kernel's start, T1 after the grid dependency wait (the call before has released it),
T2 after the input prologue (the rows read, the norm or SwiGLU applied, in shared memory), T3
when the first weight stage has landed, T4 at the end. Printed per shape and row count (median
over the blocks, us): ``wait`` T1-T0 (the kernel resident before its input is ready: the
overlap with the call before), ``prologue`` T2-T1, ``first stage`` T3-T1, ``loop`` T4-T2,
``after wait`` T4-T1 (what the call adds to a chain once released), and ``us/call`` of the
chain (weights rotated past L2). Norm calls split their prologue with two more stamps, TA after
the residual add pass and TB after the rows' sums of squares (and their scales): ``add``
TA-T1, ``squares`` TB-TA, ``scale`` T2-TB, each a mean over the blocks (the timer's 256 ns
ticks average out). The stamps are spliced into the kernel's source here (each
anchor must occur once, so a kernel change that moves one fails loudly); the engine's kernel
is untouched. Qwen3-0.6B's projection shapes with the table's configuration for each row
bucket (``MMA_CONFIGS``; the 8-row bucket's where a shape has none).

Variants of the kernel, to test what the prologue waits on: ``engine`` (as the engine builds
it), ``late`` (no weight stage requested before the grid dependency wait: the stages are asked
for after the prologue, so that its L2 reads queue behind none of this block's bulk copies),
``nores`` (norm calls without the residual add: half the prologue's L2 reads), ``serial`` (the
rows' sums of squares row after row, as before the engine took them all in one unrolled pass
over the bucket's rows; each row's sum in the same order either way, so the same product).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bulk_mma_bench import EPS, Proj  # noqa: E402
from skinny_gemm_sweep import time_calls  # noqa: E402

from cadence.model import bulk_mma as bm  # noqa: E402
from cadence.model.bulk_gemv import blocks_for, compiled, launch  # noqa: E402
from cadence.model.bulk_mma_kernel import KERNEL, SOURCE, defines  # noqa: E402

SHAPES = {"qkv": (4096, 1024, "norm"), "o": (1024, 2048, "plain"),
          "gate_up": (6144, 1024, "norm"), "down": (1024, 3072, "plain")}
STAMPS = 7

_CLOCK = ("__device__ __forceinline__ unsigned long long gt() { unsigned long long t; "
          'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }\n')
_SPLICES = [
    ("    u16* __restrict__ res_out, int m, int n, int k, float eps)",
     "    u16* __restrict__ res_out, int m, int n, int k, float eps,\n"
     "    unsigned long long* __restrict__ stamp)"),
    ("    extern __shared__ __align__(128) u8 smem[];\n",
     "    extern __shared__ __align__(128) u8 smem[];\n    const unsigned long long T0 = gt();\n"),
    ('    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");\n',
     '    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");\n'
     "    const unsigned long long T1 = gt();\n    unsigned long long TA = 0, TB = 0;\n"),
    # Inside the norm prologue: after the residual add pass, after the rows' sums of squares.
    ("        ((uint4*)(xs + r * xrow))[v] = a;\n    }\n    __syncthreads();\n"
     "    {\n        // Lane j",
     "        ((uint4*)(xs + r * xrow))[v] = a;\n    }\n    __syncthreads();\n    TA = gt();\n"
     "    {\n        // Lane j"),
    ("        rstd[tid] = rsqrtf(__fdiv_rn(fold_warps(v), (float)k) + eps);\n    }\n"
     "    __syncthreads();\n",
     "        rstd[tid] = rsqrtf(__fdiv_rn(fold_warps(v), (float)k) + eps);\n    }\n"
     "    __syncthreads();\n    TB = gt();\n"),
    ("    const int g = lane >> 2, t = lane & 3;\n",
     "    const unsigned long long T2 = gt();\n    unsigned long long T3 = 0;\n"
     "    const int g = lane >> 2, t = lane & 3;\n"),
    ("        mbar_wait(bars + 8u * slot, (u32)((i / BM_STAGES) & 1));\n",
     "        mbar_wait(bars + 8u * slot, (u32)((i / BM_STAGES) & 1));\n"
     "        if (i == 0) T3 = gt();\n"),
    ("to_bf(sum);\n        }\n    }\n}\n",
     "to_bf(sum);\n        }\n    }\n    if (threadIdx.x == 0) {\n"
     "        unsigned long long* s = stamp + 7 * blockIdx.x;\n"
     "        s[0] = T0; s[1] = T1; s[2] = T2; s[3] = T3; s[4] = gt(); s[5] = TA; s[6] = TB;\n"
     "    }\n}\n"),
]


# The stages' first requests, moved from before the grid dependency wait to after the prologue.
_EARLY_ISSUE = """    if (tid == 0) {
        for (int i = 0; i < min(BM_STAGES, count); i++) {
            issue(w, first, my_rows, k, nkc, wrow, i, stages, bars);
        }
    }
"""
_LATE_ANCHOR = "    const int g = lane >> 2, t = lane & 3;\n"
# The engine's sums of squares, every row of the bucket (BM_MR) in one pass (from the block's
# head to its end), and the row-after-row loop it replaced (the ``serial`` variant).
_ROWS_HEAD = "    {\n        // Lane j of NORM_LANES"
_ROWS_TAIL = "            if (lane == 0 && r < m) part[r * WARPS + warp] = ss;\n        }\n    }\n"
_ROWS_SERIAL = """    for (int r = 0; r < m; r++) {
        const u16* sr = (const u16*)(xs + r * xrow);
        float lanes[LPT];
        #pragma unroll
        for (int l = 0; l < LPT; l++) lanes[l] = 0.0f;
        for (int c = 0; c < k; c += NORM_LANES) {
            #pragma unroll
            for (int l = 0; l < LPT; l++) {
                int i = c + tid * LPT + l;
                if (i < k) {
                    float s = bf(sr[i]);
                    lanes[l] = fmaf(s, s, lanes[l]);
                }
            }
        }
        const float ss = fold_lanes(lanes);
        if (lane == 0) part[r * WARPS + warp] = ss;
    }
"""
VARIANTS = ("engine", "late", "nores", "serial")


def stamped_source(variant: str = "engine") -> str:
    src = SOURCE
    splices = list(_SPLICES)
    if variant == "late":
        splices += [(_EARLY_ISSUE, ""), (_LATE_ANCHOR, _EARLY_ISSUE + "    __syncthreads();\n"
                                          + _LATE_ANCHOR)]
    for old, new in splices:
        if src.count(old) != 1:
            raise SystemExit(f"anchor not found once in bulk_mma's source: {old!r}")
        src = src.replace(old, new)
    if variant == "serial":
        head, tail = src.find(_ROWS_HEAD), src.find(_ROWS_TAIL)
        if src.count(_ROWS_HEAD) != 1 or src.count(_ROWS_TAIL) != 1 or tail < head:
            raise SystemExit("the sums of squares' block not found once in bulk_mma's source")
        src = src[:head] + _ROWS_SERIAL + src[tail + len(_ROWS_TAIL):]
    marker = 'extern "C" __global__'
    return src.replace(marker, _CLOCK + marker, 1)


class Chain:
    """A projection's operands (``bulk_mma_bench.Proj``: weight copies past the L2, inputs,
    the norm's weight) run through the stamped kernel with ``m`` input rows."""

    def __init__(self, n: int, k: int, mode: str, m: int, l2: int,
                 variant: str = "engine") -> None:
        self.proj = Proj(n, k, mode, False, l2)
        self.res = mode == "norm" and variant != "nores"
        self.m = m
        self.x, self.r = self.proj.x[:m], self.proj.r[:m]
        self.out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        self.res_out = torch.empty_like(self.x)
        self.cfg = bm.MMA_CONFIGS.get((n, k, mode, "bf16", bm.mma_bucket(m))) or \
            bm.MMA_CONFIGS.get((n, k, mode, "bf16", bm.MAX_M)) or bm.MmaConfig()
        self.blocks = blocks_for(self.x.device, n)
        self.stamp = torch.zeros(self.blocks * STAMPS, dtype=torch.int64, device="cuda")
        options = defines(self.cfg.rows, self.cfg.kc, self.cfg.stages, self.cfg.threads,
                          {"plain": 0, "norm": 1}[mode], self.res, False, self.cfg.padded,
                          bm.mma_bucket(m))
        self.kernel = compiled(self.x.get_device(), stamped_source(variant), KERNEL,
                               options + ["-DBM_PHASES=1"])
        self.shared = self.cfg.shared_bytes(m, k, False)

    def call(self, i: int) -> None:
        p, norm = self.proj, self.proj.mode == "norm"
        args = (p.w[i], self.x, self.x, self.r if norm else self.x, p.nw if norm else self.x,
                self.out, self.res_out if norm else self.out, ctypes.c_int32(self.m),
                ctypes.c_int32(p.n), ctypes.c_int32(p.k), ctypes.c_float(EPS), self.stamp)
        launch(self.kernel, self.blocks, self.cfg.threads, self.shared, self.x.device, args)

    def check(self) -> float:
        """Max error of one call against float64, relative to the largest output (the stamps
        must not change the product); the reference input is the norm kernel's."""
        self.call(0)
        torch.cuda.synchronize()
        h = self.proj.h[:self.m]
        if self.proj.mode == "norm" and not self.res:
            h = F.rms_norm(self.x.float(), (self.proj.k,), self.proj.nw.float(), EPS)
        ref = F.linear(h.double(), self.proj.w[0].double())
        return float((self.out.double() - ref).abs().max() / ref.abs().max())

    def run(self, total: int) -> tuple[float, dict[str, float]]:
        """us a call of the chain, and the phases of its last call (the stamps it left)."""
        us = time_calls([lambda i=i: self.call(i) for i in range(len(self.proj.w))], total)
        t = self.stamp.view(self.blocks, STAMPS).double().cpu()
        med = {name: statistics.median((t[:, b] - t[:, a]).tolist()) / 1e3
               for name, (a, b) in {"wait": (0, 1), "prologue": (1, 2), "first stage": (1, 3),
                                    "loop": (2, 4), "after wait": (1, 4)}.items()}
        med["span"] = float(t[:, 4].max() - t[:, 1].min()) / 1e3
        if self.proj.mode == "norm":
            for name, (a, b) in {"add": (1, 5), "squares": (5, 6), "scale": (6, 2)}.items():
                med[name] = float((t[:, b] - t[:, a]).mean()) / 1e3
        return us, med


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,2,4,8")
    p.add_argument("--shapes", default="qkv,o,gate_up,down")
    p.add_argument("--variants", default="engine")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--json")
    a = p.parse_args()
    shapes = a.shapes.split(",")
    if not set(shapes) <= SHAPES.keys():
        p.error(f"--shapes: each one of {', '.join(SHAPES)}, got {a.shapes!r}")
    try:
        rows = [int(r) for r in a.rows.split(",")]
    except ValueError:
        rows = []
    if not rows or not all(1 <= m <= bm.MAX_M for m in rows):
        p.error(f"--rows: row counts 1 to {bm.MAX_M}, comma-separated, got {a.rows!r}")
    variants = a.variants.split(",")
    if not set(variants) <= set(VARIANTS):
        p.error(f"--variants: each one of {', '.join(VARIANTS)}, got {a.variants!r}")
    if a.calls < 1:
        p.error(f"--calls must be at least 1, got {a.calls}")
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (Hopper)", file=sys.stderr)
        return 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"{torch.cuda.get_device_name(0)}; us (median over blocks of the chain's last call)")
    print("shape    rows variant  us/call   wait  prologue  first stage   loop  after wait   span"
          "  config")
    rows_out = []
    for name in shapes:
        n, k, mode = SHAPES[name]
        for m in rows:
            for variant in variants:
                if variant == "nores" and mode != "norm":
                    continue
                chain = Chain(n, k, mode, m, l2, variant)
                err = chain.check()
                us, med = chain.run(a.calls)
                flag = "" if err < 0.02 else f"  WRONG (max error {err:.3g})"
                if "add" in med:
                    flag = (f"  [add {med['add']:.2f} squares {med['squares']:.2f} scale "
                            f"{med['scale']:.2f}]{flag}")
                print(f"{name:8s} {m:4d} {variant:7s} {us:8.2f} {med['wait']:6.2f} "
                      f"{med['prologue']:9.2f} {med['first stage']:12.2f} {med['loop']:6.2f} "
                      f"{med['after wait']:11.2f} {med['span']:6.2f}  {chain.cfg}{flag}",
                      flush=True)
                rows_out.append({"shape": name, "rows": m, "variant": variant,
                                 "us_per_call": us, **med, "error": err})
    if a.json:
        Path(a.json).write_text(json.dumps(rows_out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
