"""Time the decoder's (residual add +) RMSNorm fused into the skinny qkv / gate_up GEMM against
the norm kernel then the GEMM (GPU), inside CUDA graphs, per projection shape and row count.

    python scripts/fused_norm_bench.py [--models qwen3-0.6b,llama3-8b] [--rows 1,2,3,4,8,16]
        [--calls 200] [--sweep] [--late]

Per shape (the projections that take a norm) and row count, us per call of:
  today   add_rms_norm, then the projection as SkinnyLinear runs it (the table's
          configuration, or cuBLAS where the table says so): CADENCE_DISABLE_FUSED_NORM=1
  split   add_rms_norm, then the skinny GEMM at the fused configuration (_choose_norm)
  fused   the one launch at that configuration (SkinnyLinear.forward_norm)
and whether fused and split gave the same bits (with ``--late``, the late norm: whether they
agree within 3% of each element or 0.03, as its bits differ by design). Calls run back to back
in one graph, each on another copy of the weight (the copies three times the L2, as in
skinny_gemm_sweep.py), on one
x and residual (in L2, as a decode step's are). A graph of back-to-back calls hides the launch
gaps that a decode step also pays per kernel (about 1 us each), so "fused" against "today"
understates the step's gain by about that much per norm. With --sweep the fused launch is also
timed over skinny_gemm_sweep.py's grid, and the best configurations are printed as a
NORM_CONFIGS (with ``--late``: LATE_NORM_CONFIGS) literal for cadence/model/skinny_gemm.py.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from skinny_gemm_sweep import MODELS, fmt_cfg, grid, time_calls, weight_copies  # noqa: E402

from cadence.model import skinny_gemm  # noqa: E402
from cadence.model.fused_ops import add_rms_norm  # noqa: E402
from cadence.model.skinny_gemm import SkinnyLinear, row_bucket  # noqa: E402
from cadence.model.skinny_gemm_kernels import (  # noqa: E402
    SkinnyConfig,
    skinny_matmul,
    skinny_matmul_norm,
)

NORMED = ("qkv", "gate_up")  # the projections that take a norm's output
EPS = 1e-6


def _agrees(fused: torch.Tensor, split: torch.Tensor, late: bool) -> bool:
    if not late:
        return torch.equal(fused, split)
    return torch.allclose(fused.float(), split.float(), rtol=3e-2, atol=3e-2)


def _fused(x: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, w: torch.Tensor,
           cfg: SkinnyConfig, late: bool) -> torch.Tensor:
    """The one launch; ``late``: the late norm (its scale after the products)."""
    return skinny_matmul_norm(x, r, nw, EPS, w, None, cfg, late)[0]


def _linears(copies: list[torch.Tensor]) -> list[SkinnyLinear]:
    out = []
    for w in copies:
        layer = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
        layer.__class__ = SkinnyLinear
        layer.weight = torch.nn.Parameter(w, requires_grad=False)
        out.append(layer)
    return out


def _split(x: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, w: torch.Tensor,
           cfg: SkinnyConfig) -> torch.Tensor:
    h, _ = add_rms_norm(x, r, nw, EPS)
    return skinny_matmul(h, w, None, cfg)


def _today(x: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, layer: SkinnyLinear
           ) -> torch.Tensor:
    h, _ = add_rms_norm(x, r, nw, EPS)
    return layer(h)


def bench(n: int, k: int, rows: int, copies: list[torch.Tensor], calls: int, sweep: bool,
          sms: int, late: bool) -> tuple[dict[str, float], SkinnyConfig | None, bool, dict]:
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    nw = (1 + 0.2 * torch.randn(k, device="cuda")).to(torch.bfloat16)
    layers = _linears(copies)
    with torch.no_grad():
        for layer in layers:
            layer(x)  # plans, outside the capture
        times = {"today": time_calls([functools.partial(_today, x, r, nw, m) for m in layers],
                                     calls)}
        cfg = skinny_gemm._choose_norm(x.device, n, k, row_bucket(rows), late)
        same = False
        if cfg is not None:
            split = _split(x, r, nw, copies[0], cfg)
            same = _agrees(_fused(x, r, nw, copies[0], cfg, late), split, late)
            times["split"] = time_calls(
                [functools.partial(_split, x, r, nw, w, cfg) for w in copies], calls)
            times["fused"] = time_calls(
                [functools.partial(_fused, x, r, nw, w, cfg, late) for w in copies], calls)
        swept: dict[SkinnyConfig, float] = {}
        if sweep:
            for cand in dict.fromkeys(grid(rows, n, k, sms, quick=False)):
                try:
                    out = _fused(x, r, nw, copies[0], cand, late)
                    if not _agrees(out, _split(x, r, nw, copies[0], cand), late):
                        print(f"  {fmt_cfg(cand)}: not the two kernels' result", flush=True)
                        continue
                    swept[cand] = time_calls(
                        [functools.partial(_fused, x, r, nw, w, cand, late) for w in copies], calls)
                except Exception as exc:  # a configuration that cannot run here
                    print(f"  {fmt_cfg(cand)}: {type(exc).__name__}", flush=True)
    return times, cfg, same, swept


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--rows", default="1,2,3,4,8,16")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--sweep", action="store_true", help="time the fused launch over the grid")
    p.add_argument("--late", action="store_true", help="the late norm (scale after products)")
    ns = p.parse_args()
    if not torch.cuda.is_available():
        print("fused_norm_bench.py needs a CUDA device", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    l2 = getattr(props, "L2_cache_size", 50 << 20) or (50 << 20)
    print(f"{props.name}: {sms} SMs, L2 {l2 >> 20} MiB; NORM_MAX_ROWS "
          f"{skinny_gemm.NORM_MAX_ROWS}", flush=True)
    print(f"{'shape':<28}{'M':>3} {'today':>8} {'split':>8} {'fused':>8} {'saved':>7}  same  "
          "fused config")
    table: dict[tuple[int, int, int], tuple[SkinnyConfig | None, float, float]] = {}
    for model in ns.models.split(","):
        for proj, (n, k) in MODELS[model][1].items():
            if proj not in NORMED:
                continue
            copies = weight_copies(n, k, l2)
            for rows in (int(v) for v in ns.rows.split(",")):
                times, cfg, same, swept = bench(n, k, rows, copies, ns.calls, ns.sweep, sms,
                                                ns.late)
                fused, today = times.get("fused", math.inf), times["today"]
                print(f"{model + ' ' + proj + f' {n}x{k}':<28}{rows:>3} {today:>8.2f} "
                      f"{times.get('split', math.inf):>8.2f} {fused:>8.2f} "
                      f"{today - fused:>7.2f}  {'yes' if same else 'NO':<4}  {fmt_cfg(cfg)}",
                      flush=True)
                if swept and rows == row_bucket(rows):
                    best = min(swept, key=swept.__getitem__)
                    # Fused where its best beats the norm kernel then today's GEMM.
                    table[(n, k, rows)] = (best if swept[best] < today else None, swept[best],
                                           today)
            del copies
            torch.cuda.empty_cache()
    if table:
        name, kind = ("LATE_NORM_CONFIGS", "SkinnyConfig") if ns.late else (
            "NORM_CONFIGS", "SkinnyConfig | None")
        print(f"\n{name}: dict[tuple[int, int, int], {kind}] = {{")
        for (n, k, rows), (best, us, today) in sorted(table.items()):
            if best is not None or not ns.late:  # the late table lists only its wins
                print(f"    ({n}, {k}, {rows}): {fmt_cfg(best)},  # {us:.2f} vs {today:.2f} us")
        print("}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
