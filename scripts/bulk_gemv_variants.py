"""Time variants of the bulk GEMV's CUDA source side by side in one process (GPU): each a copy of
``cadence/model/bulk_gemv_kernel.py`` with its change (a module defining ``SOURCE``, ``KERNEL``,
``defines`` and ``shared_bytes``), on Llama-3-8B's four projection shapes with the committed
table's configurations.

    python scripts/bulk_gemv_variants.py FILE.py [FILE.py ...] [--weights bf16|fp8] [--rounds 2]

First every variant's output is compared with the first's (bit-equal, or it says so); then per
round and variant, us per call of each shape (calls back to back in a CUDA graph over weight
copies three times the L2, as ``bulk_gemv_bench.py``) and of a chain of eight layers' four
projections (us a layer). Rounds alternate the variants, so the machine's drift shows.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import math
import sys
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from skinny_gemm_sweep import time_calls  # noqa: E402

from cadence.model import bulk_gemv as bg  # noqa: E402
from cadence.model.fp8 import quantize_rows  # noqa: E402

SHAPES = {"qkv": (6144, 4096, "norm"), "o": (4096, 4096, "plain"),
          "gate_up": (28672, 4096, "norm"), "down": (4096, 14336, "glu")}
MODE = {"plain": 0, "norm": 1, "glu": 2}


def load(path: str) -> ModuleType:
    """The kernel-source module at ``path``; a one-line exit where it is not one."""
    if not Path(path).is_file():
        raise SystemExit(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - any error of the user's file, in one line
        raise SystemExit(f"{path}: {type(exc).__name__}: {exc}") from None
    missing = [n for n in ("SOURCE", "KERNEL", "defines", "shared_bytes") if not hasattr(module, n)]
    if missing:
        raise SystemExit(f"{path}: defines no {', '.join(missing)}")
    return module


def call(mod: ModuleType, cfg: bg.BulkConfig, fp8: bool, t: dict, ws: tuple) -> None:
    """One launch of ``mod``'s kernel as ``bulk_gemv._run`` makes it."""
    n, k, mode = t["shape"]
    w, scale = ws
    kernel = bg.compiled(0, mod.SOURCE, mod.KERNEL, mod.defines(
        cfg.rows, cfg.stages, cfg.threads, MODE[mode], mode == "norm", fp8, k, cfg.hw_cvt))
    extra = ({"norm": mode == "norm"}
             if "norm" in inspect.signature(mod.shared_bytes).parameters else {})
    shared = mod.shared_bytes(k, cfg.rows, cfg.stages, fp8, **extra)
    norm = mode == "norm"
    args = bg.kernel_args(t["x"], w, t["r"] if norm else None, t["nw"] if norm else None, scale,
                          t["out"], t["res_out"] if norm else None, 1e-6)
    device = torch.device("cuda", 0)
    bg.launch(kernel, bg.blocks_for(device, n), cfg.threads, shared, device, args)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("variants", nargs="+", help="kernel-source modules (.py)")
    p.add_argument("--weights", choices=["bf16", "fp8"], default="fp8")
    p.add_argument("--rounds", type=int, default=2)
    ns = p.parse_args()
    mods = {Path(v).stem: load(v) for v in ns.variants}
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    torch.set_grad_enabled(False)
    fp8 = ns.weights == "fp8"
    table = bg.BULK_FP8_CONFIGS if fp8 else bg.BULK_CONFIGS
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    shapes = {}
    for name, (n, k, mode) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda") / k**0.5).bfloat16()
        ws = quantize_rows(w) if fp8 else (w, None)
        count = max(2, math.ceil(3 * l2 / (n * k * (1 if fp8 else 2))))
        copies = [ws] + [(ws[0].clone(), None if ws[1] is None else ws[1].clone())
                         for _ in range(count - 1)]
        t = dict(shape=(n, k, mode), copies=copies, cfg=table[(n, k, mode)],
                 x=torch.randn(1, 2 * k if mode == "glu" else k, device="cuda").bfloat16(),
                 r=torch.randn(1, k, device="cuda").bfloat16(),
                 nw=(1 + 0.1 * torch.randn(k, device="cuda")).bfloat16(),
                 out=torch.empty(1, n, device="cuda", dtype=torch.bfloat16),
                 res_out=torch.empty(1, k, device="cuda", dtype=torch.bfloat16))
        shapes[name] = t
        first = None
        for vname, mod in mods.items():
            call(mod, t["cfg"], fp8, t, ws)
            got = t["out"].clone()
            if first is None:
                first = got
            elif not torch.equal(got, first):
                print(f"{name}: {vname}'s output differs from the first variant's", flush=True)
    for rnd in range(ns.rounds):
        for vname, mod in mods.items():
            line = []
            for name, t in shapes.items():
                us = time_calls([lambda c=c, t=t, m=mod: call(m, t["cfg"], fp8, t, c)
                                 for c in t["copies"]], 300)
                line.append(f"{name} {us:.2f}")
            chain = [lambda t=t, c=t["copies"][layer % len(t["copies"])], m=mod:
                     call(m, t["cfg"], fp8, t, c)
                     for layer in range(8) for t in shapes.values()]
            per_layer = time_calls(chain, 400) * len(shapes)
            print(f"round {rnd} {vname}: " + ", ".join(line)
                  + f"; chain {per_layer:.2f} us a layer", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
