"""Time the one-launch MLP block against the unfused kernels it replaces (GPU), one token.

    python scripts/mlp_block_bench.py [--models qwen3-0.6b] [--layers 28] [--variants 16x8,4x4]

For each model's shapes, ``--layers`` layers' weights (each layer its own, as in a decode step,
so that no call finds its weights in L2) run ``o_proj`` -> add + RMSNorm -> ``gate_up_proj`` ->
SwiGLU -> ``down_proj`` for one row two ways inside one CUDA graph each: the skinny kernels the
decoder runs today (``SkinnyLinear``: o, gate_up with the norm in its loads, down with SwiGLU in
its loads) and ``mlp_block``. Prints us per layer for both, the weights' bytes per us, and the
largest difference between the two paths' outputs (bf16: the dots' order of additions differs).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from skinny_gemm_sweep import time_calls  # noqa: E402 (this script's directory)
from torch import nn  # noqa: E402

from cadence.model import mlp_block as block_module  # noqa: E402
from cadence.model.fused_ops import norm_and_project, silu_and_mul  # noqa: E402
from cadence.model.mlp_block import mlp_block  # noqa: E402
from cadence.model.skinny_gemm import SkinnyLinear  # noqa: E402

SHAPES = {"qwen3-0.6b": (1024, 2048, 3072)}  # hidden, q width, intermediate


def _linear(n: int, k: int) -> SkinnyLinear:
    layer = nn.Linear(k, n, bias=False, dtype=torch.bfloat16, device="cuda")
    nn.init.normal_(layer.weight, std=k**-0.5)
    layer.__class__ = SkinnyLinear
    return layer.requires_grad_(False)


def _graph_us(fn: Callable[[], object], layers: int, replays: int = 50) -> float:
    """us per layer: ``fn`` (a step's ``layers`` layers) captured in a CUDA graph, replayed."""
    return time_calls([fn], replays) / layers


Layer = tuple[SkinnyLinear, SkinnyLinear, SkinnyLinear, torch.Tensor]
EPS = 1e-6


def unfused(layers: list[Layer], a: torch.Tensor, res: torch.Tensor) -> list[torch.Tensor]:
    """The decoder's kernels today: o; gate_up with the norm in its loads; down with SwiGLU."""
    outs = []
    for o, gu, d, nw in layers:
        gate_up, _ = gu.forward_norm(o(a), res, nw, EPS)
        outs.append(d.forward_glu(gate_up))
    return outs


def fused(layers: list[Layer], a: torch.Tensor, res: torch.Tensor) -> list[torch.Tensor]:
    outs = []
    for o, gu, d, nw in layers:
        got = mlp_block(a, res, o.weight, nw, EPS, gu.weight, d.weight)
        assert got is not None, "the block did not launch"
        outs.append(got[0])
    return outs


def reference(layers: list[Layer], a: torch.Tensor, res: torch.Tensor) -> list[torch.Tensor]:
    """The unfused arithmetic through torch's own GEMMs."""
    outs = []
    for o, gu, d, nw in layers:
        h = torch.nn.functional.linear(a, o.weight)
        gate_up, _ = norm_and_project(functools.partial(_matmul_t, gu.weight), h, res, nw, EPS)
        outs.append(_matmul_t(d.weight, silu_and_mul(gate_up)))
    return outs


def _matmul_t(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return x @ weight.T


def run(model: str, n_layers: int, variants: list[tuple[int, int]]) -> None:
    hidden, q, inter = SHAPES[model]
    layers = [(_linear(hidden, q), _linear(2 * inter, hidden), _linear(hidden, inter),
               torch.rand(hidden, dtype=torch.bfloat16, device="cuda") + 0.5)
              for _ in range(n_layers)]
    a = torch.randn((1, q), dtype=torch.bfloat16, device="cuda")
    res = torch.randn((1, hidden), dtype=torch.bfloat16, device="cuda")
    want, got, ref = unfused(layers, a, res), fused(layers, a, res), reference(layers, a, res)
    diff = max((w.float() - g.float()).abs().max().item() for w, g in zip(want, got))
    diff_ref = max((r.float() - g.float()).abs().max().item() for r, g in zip(ref, got))
    scale = max(w.float().abs().max().item() for w in want)
    t_unfused = _graph_us(functools.partial(unfused, layers, a, res), n_layers)
    t_fused = _graph_us(functools.partial(fused, layers, a, res), n_layers)
    for rows, warps in variants:  # other tiles and warps (the module's constants, for a while)
        kept = block_module.ROWS, block_module.NUM_WARPS
        block_module.ROWS, block_module.NUM_WARPS = rows, warps
        try:
            us = _graph_us(functools.partial(fused, layers, a, res), n_layers)
        finally:
            block_module.ROWS, block_module.NUM_WARPS = kept
        print(f"{model}: block with {rows}-row tiles and {warps} warps: {us:.2f} us")
    repeat = all(torch.equal(x, y) for x, y in zip(got, fused(layers, a, res)))
    mb = (hidden * q + 3 * hidden * inter) * 2 / 1e6
    print(f"{model}: {mb:.1f} MB of weights a layer; unfused kernels {t_unfused:.2f} us "
          f"({mb / t_unfused:.2f} TB/s), one-launch block {t_fused:.2f} us "
          f"({mb / t_fused:.2f} TB/s); max |block - unfused| {diff:.4g}, "
          f"|block - torch| {diff_ref:.4g} (outputs up to {scale:.3g}); "
          f"block repeats its bits: {repeat}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="qwen3-0.6b")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--variants", default="", help="ROWSxWARPS,...: other launches")
    args = parser.parse_args()
    variants = [tuple(int(v) for v in item.split("x")) for item in args.variants.split(",") if item]
    torch.manual_seed(0)
    for model in args.models.split(","):
        run(model, args.layers, variants)


if __name__ == "__main__":
    main()
