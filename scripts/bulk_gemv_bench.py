"""Time the bulk-copy GEMV (``cadence/model/bulk_gemv.py``) against today's one-row projections
(GPU): per shape, then a decoder layer's four projections in a chain.

    python scripts/bulk_gemv_bench.py [--models llama3-8b,qwen3-0.6b] [--calls 200]
        [--quick | --threads 256,512] [--layers 8] [--weights bf16|fp8] [--json FILE]

1. Per projection shape at one row (qkv and gate_up with their input's add + RMSNorm, down with
   SwiGLU, o plain): the checks (res_out bit-equal to add_rms_norm's, the product within bf16
   tolerance of F.linear over float64 inputs), then us per call of today's path
   (``SkinnyLinear`` as the decoder calls it) and of each bulk configuration, calls back to
   back in one CUDA graph on copies of the weight three times the L2 (as skinny_gemm_sweep.py).
2. A chain of ``--layers`` layers' four projections (qkv -> o -> gate_up -> down, each on its own
   weight, the output feeding the next), once with today's path and once with the best bulk
   configuration per shape: in a chain each kernel's start overlaps the one before (PDL), which
   an isolated call does not show. Prints the per-layer us and the weight TB/s of each.
3. The table for ``cadence/model/bulk_gemv.py`` (``BULK_CONFIGS``; with ``--weights fp8``,
   e4m3 weights with row scales against ``Fp8Linear``'s other kernels: ``BULK_FP8_CONFIGS``)
   as a Python literal.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from skinny_gemm_sweep import MODELS, time_calls  # noqa: E402

from cadence.model.bulk_gemv import (  # noqa: E402
    BulkConfig,
    bulk_applies,
    bulk_gemv,
    bulk_gemv_norm,
)
from cadence.model.fp8 import Fp8Linear, quantize_rows  # noqa: E402
from cadence.model.fused_ops import add_rms_norm, silu_and_mul  # noqa: E402
from cadence.model.skinny_gemm import SkinnyLinear  # noqa: E402

EPS = 1e-6
MODES = {"qkv": "norm", "o": "plain", "gate_up": "norm", "down": "glu"}
# Shared memory of a block that leaves room for the next kernel's block on its SM (of 228 KB).
SMALL_SHARED = 110 * 1024


def weight_bytes(fp8: bool) -> int:
    """Bytes a weight: e4m3 or bfloat16."""
    return 1 if fp8 else 2


def thread_counts(text: str) -> tuple[int, ...]:
    """``--threads``: a comma-separated list of 128, 256 and 512."""
    try:
        counts = tuple(int(t) for t in text.split(","))
    except ValueError:
        counts = ()
    if not counts or any(t not in (128, 256, 512) for t in counts):
        raise argparse.ArgumentTypeError(f"expected 128, 256 or 512, comma-separated: {text!r}")
    return counts


def configs(k: int, threads_list: tuple[int, ...], fp8: bool = False) -> list[BulkConfig]:
    out = []
    for threads in threads_list:
        for rows in (1, 2, 4, 8, 16, 32):
            for stages in (2, 3, 4, 6, 8):
                for hw_cvt in (False, True) if fp8 else (False,):
                    cfg = BulkConfig(rows, stages, threads, hw_cvt)
                    stage = rows * weight_bytes(fp8) * k
                    if 4096 <= stage <= 65536 and cfg.shared_bytes(k, fp8) <= 227 * 1024:
                        out.append(cfg)
    return out


# A weight as the kernels take it: (bf16 weight, None) or (e4m3 weight, float32 row scales).
Weight = tuple[torch.Tensor, "torch.Tensor | None"]


def weight_of(n: int, k: int, fp8: bool) -> Weight:
    w = (torch.randn(n, k, device="cuda") / k**0.5).bfloat16()
    return quantize_rows(w) if fp8 else (w, None)


def inputs(mode: str, k: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(k)
    width = 2 * k if mode == "glu" else k
    x = torch.randn(1, width, device="cuda", generator=g).bfloat16()
    r = torch.randn(1, k, device="cuda", generator=g).bfloat16()
    nw = (1 + 0.1 * torch.randn(k, device="cuda", generator=g)).bfloat16()
    return dict(x=x, r=r, nw=nw)


def bulk_call(mode: str, t: dict, ws: Weight, cfg: BulkConfig) -> torch.Tensor:
    w, scale = ws
    if mode == "norm":
        return bulk_gemv_norm(t["x"], t["r"], t["nw"], EPS, w, cfg, scale)[0]
    return bulk_gemv(t["x"], w, cfg, glu=mode == "glu", scale=scale)


def today_call(mode: str, t: dict, module: SkinnyLinear | Fp8Linear) -> torch.Tensor:
    if mode == "norm":
        return module.forward_norm(t["x"], t["r"], t["nw"], EPS)[0]
    if mode == "glu":
        return module.forward_glu(t["x"])
    return module(t["x"])


def check(mode: str, t: dict, ws: Weight, cfg: BulkConfig) -> str | None:
    """None where the launch agrees with the reference, else what differs."""
    w, scale = ws
    if mode == "norm":
        out, s = bulk_gemv_norm(t["x"], t["r"], t["nw"], EPS, w, cfg, scale)
        h, s_ref = add_rms_norm(t["x"], t["r"], t["nw"], EPS)
        if not torch.equal(s, s_ref):
            return "new residual differs from add_rms_norm's"
    else:
        out = bulk_gemv(t["x"], w, cfg, glu=mode == "glu", scale=scale)
        h = silu_and_mul(t["x"]) if mode == "glu" else t["x"]
    wd = w.double() if scale is None else w.double() * scale.double()[:, None]
    ref = F.linear(h.double(), wd)
    err = float((out.double() - ref).abs().max())
    scale = float(ref.abs().max())
    if not err <= 0.01 * scale + 1e-3:
        return f"max error {err:.3g} (scale {scale:.3g})"
    return None


def copies_of(n: int, k: int, l2: int, fp8: bool) -> list[Weight]:
    count = max(2, math.ceil(3 * l2 / (weight_bytes(fp8) * n * k)))
    w, scale = weight_of(n, k, fp8)
    return [(w, scale)] + [(w.clone(), None if scale is None else scale.clone())
                           for _ in range(count - 1)]


def module_of(ws: Weight) -> SkinnyLinear | Fp8Linear:
    w, scale = ws
    if scale is not None:
        return Fp8Linear(w, scale, None, torch.bfloat16)
    m = SkinnyLinear(w.shape[1], w.shape[0], bias=False, device="cuda", dtype=w.dtype)
    m.weight.data = w
    return m


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="llama3-8b,qwen3-0.6b")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="256 threads only")
    p.add_argument("--threads", type=thread_counts, default=(128, 256, 512),
                   help="threads per block to try (128, 256, 512)")
    p.add_argument("--json", help="write the best configuration per shape here")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--weights", choices=["bf16", "fp8"], default="bf16")
    ns = p.parse_args()
    fp8 = ns.weights == "fp8"
    threads_list = (256,) if ns.quick else ns.threads
    if not torch.cuda.is_available():
        print("bulk_gemv_bench.py needs a CUDA device", file=sys.stderr)
        return 2
    torch.set_grad_enabled(False)
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20) or (50 << 20)
    print(f"{props.name}: {props.multi_processor_count} SMs", flush=True)
    best: dict[tuple[int, int, str], tuple[BulkConfig, float, float]] = {}
    best_small: dict[tuple[int, int, str], BulkConfig] = {}
    for model in ns.models.split(","):
        layers, projs = MODELS[model]
        for proj, (n, k) in projs.items():
            mode = MODES[proj]
            copies = copies_of(n, k, l2, fp8)
            t = inputs(mode, k)
            mod = [module_of(w) for w in copies]
            today_call(mode, t, mod[0])  # compiles, plans
            today = time_calls([functools.partial(today_call, mode, t, m) for m in mod],
                               ns.calls)
            timings = {}
            for cfg in configs(k, threads_list, fp8):
                if not bulk_applies(t["x"], copies[0][0], cfg, mode, t["r"], t["nw"],
                                    copies[0][1]):
                    continue
                why = check(mode, t, copies[0], cfg)
                if why is not None:
                    print(f"  {model} {proj} {cfg}: WRONG: {why}", flush=True)
                    continue
                timings[cfg] = time_calls(
                    [functools.partial(bulk_call, mode, t, w, cfg) for w in copies], ns.calls)
            if not timings:
                print(f"{model} {proj}: no configuration ran", flush=True)
                continue
            ranked = sorted(timings, key=timings.__getitem__)
            cfg = ranked[0]
            kb = weight_bytes(fp8) * n * k / 1e3  # KB / us = GB/s
            best[(n, k, mode)] = (cfg, timings[cfg], today)
            small = [c for c in ranked if c.shared_bytes(k, fp8) <= SMALL_SHARED]
            if small:
                best_small[(n, k, mode)] = small[0]
            print(f"{model} {proj} {n}x{k} ({mode}): today {today:.2f} us "
                  f"({kb / today:.0f} GB/s); bulk best {timings[cfg]:.2f} us "
                  f"({kb / timings[cfg]:.0f} GB/s) {cfg}; best of two per SM "
                  f"{timings[small[0]] if small else math.inf:.2f} us", flush=True)
            for c in ranked[1:6]:
                print(f"    {timings[c]:.2f} us {c}", flush=True)
            del copies, mod
            torch.cuda.empty_cache()
        chain(model, projs, {key: v[0] for key, v in best.items()}, best_small, ns.layers,
              ns.calls, fp8)
    name = "BULK_FP8_CONFIGS" if fp8 else "BULK_CONFIGS"
    print(f"\n{name}: dict[tuple[int, int, str], BulkConfig] = {{")
    for (n, k, mode), (cfg, us, today) in sorted(best.items()):
        cvt = ", hw_cvt=True" if cfg.hw_cvt else ""
        print(f"    ({n}, {k}, \"{mode}\"): BulkConfig({cfg.rows}, {cfg.stages}, "
              f"{cfg.threads}{cvt}),  # {us:.2f} vs {today:.2f} us")
    print("}", flush=True)
    if ns.json:
        rows = [dict(n=n, k=k, mode=mode, rows=cfg.rows, stages=cfg.stages, threads=cfg.threads,
                     hw_cvt=cfg.hw_cvt, us=us, today_us=today)
                for (n, k, mode), (cfg, us, today) in best.items()]
        Path(ns.json).write_text(json.dumps(dict(weights=ns.weights, table=rows), indent=1))
    return 0


def chain(model: str, projs: dict, best: dict, best_small: dict, layers: int,
          calls: int, fp8: bool) -> None:
    """us per layer of the four projections in sequence: today's kernels (and, where it runs,
    qkv then the MLP block), against the bulk kernels at each shape's best configuration and
    at its best that leaves room for a second block per SM."""
    from cadence.model.mlp_block import block_applies, mlp_block

    k_in = projs["qkv"][1]
    weights = {proj: [weight_of(n, k, fp8) for _ in range(layers)]
               for proj, (n, k) in projs.items()}
    mods = {proj: [module_of(w) for w in ws] for proj, ws in weights.items()}
    x0 = torch.randn(1, k_in, device="cuda").bfloat16()
    r0 = torch.randn(1, k_in, device="cuda").bfloat16()
    nw = (1 + 0.1 * torch.randn(k_in, device="cuda")).bfloat16()
    a0 = torch.randn(1, projs["o"][1], device="cuda").bfloat16()  # the attention's output
    total_kb = sum(weight_bytes(fp8) * n * k for n, k in projs.values()) / 1e3

    def layer_today(i: int) -> None:
        _, s = mods["qkv"][i].forward_norm(x0, r0, nw, EPS)
        o = mods["o"][i](a0)
        gu, _ = mods["gate_up"][i].forward_norm(o, s, nw, EPS)
        mods["down"][i].forward_glu(gu)

    def layer_block(i: int) -> None:
        _, s = mods["qkv"][i].forward_norm(x0, r0, nw, EPS)
        mlp_block(a0, s, weights["o"][i][0], nw, EPS, weights["gate_up"][i][0],
                  weights["down"][i][0])

    def layer_bulk(i: int, table: dict) -> None:
        def cfg(proj: str) -> BulkConfig:
            n, k = projs[proj]
            return table[(n, k, MODES[proj])]
        _, s = bulk_gemv_norm(x0, r0, nw, EPS, weights["qkv"][i][0], cfg("qkv"),
                              weights["qkv"][i][1])
        o = bulk_gemv(a0, weights["o"][i][0], cfg("o"), scale=weights["o"][i][1])
        gu, _ = bulk_gemv_norm(o, s, nw, EPS, weights["gate_up"][i][0], cfg("gate_up"),
                               weights["gate_up"][i][1])
        bulk_gemv(gu, weights["down"][i][0], cfg("down"), glu=True, scale=weights["down"][i][1])

    variants = [("today", layer_today)]
    if not fp8 and block_applies(1, x0.dtype, x0.device, r0, weights["o"][0][0], nw,
                                 weights["gate_up"][0][0], weights["down"][0][0]):
        variants.append(("today, MLP block", layer_block))
    for name, table in (("bulk", best), ("bulk, two per SM", best_small)):
        if all((n, k, MODES[p]) in table for p, (n, k) in projs.items()):
            variants.append((name, functools.partial(layer_bulk, table=table)))
    for name, fn in variants:
        us = time_calls([functools.partial(fn, i) for i in range(layers)], calls // 4)
        print(f"{model} chain {name}: {us:.2f} us per layer ({total_kb / us:.0f} GB/s of "
              f"weights)", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
