"""Time the tensor-core bulk GEMM (``cadence/model/bulk_mma.py``) against the projections' other
kernels (GPU), per shape and row count, then a decoder layer's four projections in a chain.

    python scripts/bulk_mma_bench.py [--models qwen3-0.6b,llama3-8b] [--weights bf16,fp8]
        [--rows 1,2,4,8] [--quick] [--calls 200] [--layers 8]

1. Per projection shape, weight type and row count (qkv and gate_up with their input's add +
   RMSNorm, down with SwiGLU, o plain): each configuration checked against float64, then us per call of the other path (bfloat16: ``SkinnyLinear`` as the decoder calls
   it, the one-row bulk GEMV included; e4m3: the norm or SwiGLU kernel, then the weight-only
   kernel) and of each configuration, calls back to back in one CUDA graph on copies of the
   weight three times the L2.
2. For each row count, a chain of ``--layers`` layers' four projections (qkv -> o -> gate_up ->
   down), the other path against the best configuration per shape.
3. ``MMA_CONFIGS`` for ``cadence/model/bulk_mma.py``: the row counts where the kernel won.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bulk_gemv_bench import EPS, MODES, module_of  # noqa: E402
from skinny_gemm_sweep import MODELS, time_calls  # noqa: E402

from cadence.model import bulk_mma as bm  # noqa: E402
from cadence.model.fp8 import quantize_rows  # noqa: E402
from cadence.model.fp8_kernels import weight_only_linear  # noqa: E402
from cadence.model.fused_ops import add_rms_norm, silu_and_mul  # noqa: E402


def configs(k: int, fp8: bool, quick: bool) -> list[bm.MmaConfig]:
    """Stages of whole rows (kc = K) or of column chunks, 1 stage (a block's rows all at once,
    where they fit) to 6; --quick: 256 threads, chunks of 2048 or more, up to 4 stages."""
    out = []
    widths = (2048, 4096) if quick else (256, 512, 1024, 2048, 4096)
    for threads in (256,) if quick else (128, 256, 512):
        for rows in (16, 32):
            for kc in sorted({min(c, k) for c in widths}):
                for stages, padded in itertools.product((1, 2, 3, 4) if quick
                                                        else (1, 2, 3, 4, 6), (True, False)):
                    try:
                        cfg = bm.MmaConfig(rows, kc, stages, threads, padded)
                    except ValueError:
                        continue
                    stage = rows * min(kc, k) * (1 if fp8 else 2)
                    if 4096 <= stage <= 131072 and \
                            cfg.shared_bytes(1, k, fp8) <= bm.MAX_SHARED:
                        out.append(cfg)
    return out


class Proj:
    """One projection's weight copies (bfloat16, or e4m3 with scales) and inputs."""

    def __init__(self, n: int, k: int, mode: str, fp8: bool, l2: int) -> None:
        self.n, self.k, self.mode, self.fp8 = n, k, mode, fp8
        count = max(2, math.ceil(3 * l2 / ((1 if fp8 else 2) * n * k)))
        first = (torch.randn(n, k, device="cuda") / k**0.5).bfloat16()
        self.w, self.s = [], []
        for _ in range(count):
            if fp8:
                q, s = quantize_rows(first)
                self.w.append(q)
                self.s.append(s)
            else:
                self.w.append(first.clone())
                self.s.append(None)
        self.mods = None if fp8 else [module_of((w, None)) for w in self.w]
        g = torch.Generator(device="cuda").manual_seed(k)
        width = 2 * k if mode == "glu" else k
        self.x = torch.randn(bm.MAX_M, width, device="cuda", generator=g).bfloat16()
        self.r = torch.randn(bm.MAX_M, k, device="cuda", generator=g).bfloat16()
        self.nw = (1 + 0.1 * torch.randn(k, device="cuda", generator=g)).bfloat16()
        self.h = self.pre(self.x, self.r)  # the plain launch's input, for its checks

    def pre(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """The input of the product: the norm's or SwiGLU's output, or x."""
        return (add_rms_norm(x, r, self.nw, EPS)[0] if self.mode == "norm"
                else silu_and_mul(x) if self.mode == "glu" else x)

    def today(self, i: int, m: int) -> torch.Tensor:
        x, r = self.x[:m], self.r[:m]
        if not self.fp8:
            mod = self.mods[i]
            if self.mode == "norm":
                return mod.forward_norm(x, r, self.nw, EPS)[0]
            return mod.forward_glu(x) if self.mode == "glu" else mod(x)
        return weight_only_linear(self.pre(x, r), self.w[i], self.s[i])

    def mma(self, i: int, m: int, cfg: bm.MmaConfig, split: bool = False) -> torch.Tensor:
        """The fused launch, or with ``split`` the norm or SwiGLU kernel, then a plain one."""
        x, r = self.x[:m], self.r[:m]
        if split:
            return bm.bulk_mma(self.pre(x, r), self.w[i], cfg, scale=self.s[i])
        if self.mode == "norm":
            return bm.bulk_mma_norm(x, r, self.nw, EPS, self.w[i], cfg, self.s[i])[0]
        return bm.bulk_mma(x, self.w[i], cfg, glu=self.mode == "glu", scale=self.s[i])

    def applies(self, cfg: bm.MmaConfig, m: int, split: bool = False) -> bool:
        if split:
            return bm.mma_applies(self.h[:m], self.w[0], cfg, "plain", self.s[0])
        return bm.mma_applies(self.x[:m], self.w[0], cfg, self.mode, self.s[0], self.r[:m],
                              self.nw)

    def wrong(self, cfg: bm.MmaConfig, m: int, split: bool = False) -> str | None:
        w = self.w[0].double() if not self.fp8 else self.w[0].double() * self.s[0].double()[:, None]
        ref = F.linear(self.h[:m].double(), w)
        err = float((self.mma(0, m, cfg, split).double() - ref).abs().max())
        return None if err <= 0.01 * float(ref.abs().max()) + 1e-3 else f"max error {err:.3g}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="qwen3-0.6b,llama3-8b")
    p.add_argument("--weights", default="bf16,fp8")
    p.add_argument("--rows", default="1,2,4,8")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--quick", action="store_true",
                   help="256 threads, 1-4 stages of 2048 columns or more only")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--no-split", action="store_true",
                   help="skip the norm or SwiGLU kernel + plain launch comparison")
    p.add_argument("--json", help="also write the table here: [[n, k, mode, wtype, rows, "
                   "[rows, kc, stages, threads, padded]], ...]")
    ns = p.parse_args()
    if not torch.cuda.is_available():
        print("bulk_mma_bench.py needs a CUDA device", file=sys.stderr)
        return 2
    torch.set_grad_enabled(False)
    bm.MMA_CONFIGS.clear()  # "today" is the path without this kernel
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20) or (50 << 20)
    rows = [int(r) for r in ns.rows.split(",")]
    print(f"{props.name}: {props.multi_processor_count} SMs", flush=True)
    table: dict[tuple[int, int, str, str, int], tuple[bm.MmaConfig, float, float]] = {}
    for model in ns.models.split(","):
        _, projs = MODELS[model]
        for wtype in ns.weights.split(","):
            fp8 = wtype == "fp8"
            best: dict[tuple[str, int], bm.MmaConfig] = {}
            for proj, (n, k) in projs.items():
                mode = MODES[proj]
                pr = Proj(n, k, mode, fp8, l2)
                every = configs(k, fp8, ns.quick)
                for m in rows:
                    pr.today(0, m)  # compiles, plans
                    today = time_calls([functools.partial(pr.today, i, m)
                                        for i in range(len(pr.w))], ns.calls)
                    if mode != "plain" and not ns.no_split:
                        # The norm or SwiGLU kernel, then a plain launch: where it beats the
                        # other path the table lists the plain launch, and the fused one only
                        # where it beats both.
                        split = {c: time_calls([functools.partial(pr.mma, i, m, c, True)
                                                for i in range(len(pr.w))], ns.calls)
                                 for c in every if pr.applies(c, m, True)
                                 and not _report_wrong(model, proj, c, pr.wrong(c, m, True))}
                        if split:
                            c = min(split, key=split.__getitem__)
                            print(f"{model} {wtype} {proj} rows {m}: {mode} kernel + plain mma "
                                  f"{split[c]:.2f} us {c}", flush=True)
                            if split[c] < today:
                                table[(n, k, "plain", wtype, m)] = (c, split[c], today)
                                today = split[c]
                    cands = [c for c in every if pr.applies(c, m)
                             and not _report_wrong(model, proj, c, pr.wrong(c, m))]
                    timings = {c: time_calls([functools.partial(pr.mma, i, m, c)
                                              for i in range(len(pr.w))], ns.calls)
                               for c in cands}
                    if not timings:
                        print(f"{model} {wtype} {proj} rows {m}: no configuration", flush=True)
                        continue
                    ranked = sorted(timings, key=timings.__getitem__)
                    cfg = ranked[0]
                    best[(proj, m)] = cfg
                    gbs = (1 if fp8 else 2) * n * k / 1e3
                    print(f"{model} {wtype} {proj} {n}x{k} ({mode}) rows {m}: today "
                          f"{today:.2f} us ({gbs / today:.0f} GB/s); mma {timings[cfg]:.2f} us "
                          f"({gbs / timings[cfg]:.0f} GB/s) {cfg}; next "
                          + ", ".join(f"{timings[c]:.2f}" for c in ranked[1:4]), flush=True)
                    if timings[cfg] < today:
                        table[(n, k, mode, wtype, m)] = (cfg, timings[cfg], today)
                del pr
                torch.cuda.empty_cache()
            for m in rows:
                if all((p, m) in best for p in projs):
                    chain(model, wtype, projs, {p: best[(p, m)] for p in projs}, m, ns, l2)
    print("\nMMA_CONFIGS: dict[tuple[int, int, str, str, int], MmaConfig] = {")
    for (n, k, mode, wtype, m), (cfg, us, today) in sorted(table.items()):
        print(f"    ({n}, {k}, \"{mode}\", \"{wtype}\", {m}): MmaConfig({cfg.rows}, {cfg.kc}, "
              f"{cfg.stages}, {cfg.threads}, {cfg.padded}),  # {us:.2f} vs {today:.2f} us")
    print("}", flush=True)
    if ns.json:
        entries = [[*key, [c.rows, c.kc, c.stages, c.threads, c.padded]]
                   for key, (c, _, _) in sorted(table.items())]
        Path(ns.json).write_text(json.dumps(entries))
    return 0


def _report_wrong(model: str, proj: str, cfg: bm.MmaConfig, why: str | None) -> bool:
    if why is not None:
        print(f"  {model} {proj} {cfg}: WRONG: {why}", flush=True)
    return why is not None


def chain(model: str, wtype: str, projs: dict, cfgs: dict, m: int, ns: argparse.Namespace,
          l2: int) -> None:
    """us per layer of the four projections in sequence at ``m`` rows: the other path against
    the best configuration per shape (each layer on weights of its own)."""
    fp8 = wtype == "fp8"
    layers = {p: [Proj(n, k, MODES[p], fp8, 0) for _ in range(ns.layers)]
              for p, (n, k) in projs.items()}

    def layer(i: int, mma: bool) -> None:
        for p in ("qkv", "o", "gate_up", "down"):
            pr = layers[p][i]
            pr.mma(0, m, cfgs[p]) if mma else pr.today(0, m)

    total_kb = sum((1 if fp8 else 2) * n * k for n, k in projs.values()) / 1e3
    for name, mma in (("today", False), ("mma", True)):
        us = time_calls([functools.partial(layer, i, mma) for i in range(ns.layers)],
                        ns.calls // 4)
        print(f"{model} {wtype} rows {m} chain {name}: {us:.2f} us per layer "
              f"({total_kb / us:.0f} GB/s of weights)", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
