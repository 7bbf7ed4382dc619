"""Time the grouped MoE GEMMs over tiles (GPU), at decode batch sizes, bf16 and FP8 experts.

    python scripts/moe_sweep.py [--model qwen3-30b-a3b] [--tokens 1,8,32] [--budget-s 240]
    python scripts/moe_sweep.py --decode [--tokens 1,2]   # decode kernels against grouped
    python scripts/moe_sweep.py --down [--tokens 1,8]     # the decode down kernel's tiles
    python scripts/moe_sweep.py --router [--tokens 1,64]  # route_fused against linear + route

For each token count the routing is random (top-k of a softmax over random logits); the graph
repeats the call with the expert ids shifted, so that the calls together touch about three times
the L2 in experts (a decode step streams them from HBM; with few experts the shifts revisit the
same ones and L2 hits flatter the figures), and each tile of one kernel is timed inside a CUDA graph of back-to-back ``fused_moe_triton``
calls with the other kernel's tile at its default; the kernel's share is the call's time minus
the default call's. Each tile's output is checked against the default tile's first. Prints,
per token count and dtype, the default and the best tiles in us per call and the experts' bytes
per us, then ``MOE_TILES`` for ``cadence/model/moe.py`` (only tiles at least 3% faster).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from skinny_gemm_sweep import time_calls  # noqa: E402  (this directory is on sys.path)

from cadence.model.fp8 import quantize_rows  # noqa: E402
from cadence.model.moe import (  # noqa: E402
    DEFAULT_TILE,
    MoeTile,
    decode_tile,
    fused_moe_triton,
    pair_bucket,
)
from cadence.model.moe_decode import DecodeTile, fused_moe_decode  # noqa: E402
from cadence.model.moe_router import route, route_fused  # noqa: E402
from cadence.model.presets import preset_config  # noqa: E402

TILES = [MoeTile(n, k, w, st) for (n, k), w, st in itertools.product(
    [(16, 128), (16, 256), (32, 64), (32, 128), (32, 256), (64, 64), (64, 128)], (4, 8), (2, 4))]
KEEP_MARGIN = 0.97


def time_graph(call) -> float:
    """us per fused MoE call: ``call()`` issues some calls and returns how many; replayed from
    a CUDA graph by skinny_gemm_sweep.time_calls."""
    count = call()  # the warm-up: compiles
    return time_calls([call], max(2, 200 // count)) / count


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Experts ``[E, rows, K]`` in e4m3 with row scales ``[E, rows]``, as --quantization does."""
    q, scale = quantize_rows(w.reshape(-1, w.shape[-1]))
    return q.view(w.shape), scale.view(w.shape[:2])


DECODE_CANDIDATES = [DecodeTile(16, 128, 4, 3), DecodeTile(8, 256, 4, 3),
                     DecodeTile(32, 128, 8, 3), DecodeTile(16, 256, 8, 2)]


def compare_decode(tokens, x, weights, ids, w, fp8, l2, hidden, inter, experts) -> None:
    """us per fused MoE call: the grouped path (measured tiles) against the decode kernels with
    each candidate tile for both kernels, experts rotated past L2 as in the sweep."""
    touched = int(torch.unique(ids).numel())
    step_bytes = touched * 3 * inter * hidden * (1 if fp8 else 2)
    copies = max(2, math.ceil(3 * l2 / step_bytes))
    shift = [torch.remainder(ids + 17 * i, experts) for i in range(copies)]
    want = fused_moe_triton(x, weights, ids, w[0], w[1], w[2], decode=False).float()

    def grouped():
        for ids_i in shift:
            fused_moe_triton(x, weights, ids_i, w[0], w[1], w[2], decode=False)
        return len(shift)

    base = time_graph(grouped)
    line = f"tokens {tokens} {'fp8' if fp8 else 'bf16'}: grouped {base:.2f} us"
    for tile in DECODE_CANDIDATES:
        got = fused_moe_decode(x, weights, ids, w[0], w[1], w[2], (tile, tile)).float()
        ok = torch.allclose(got, want, atol=2e-2, rtol=2e-2)

        def decode(tile=tile):
            for ids_i in shift:
                fused_moe_decode(x, weights, ids_i, w[0], w[1], w[2], (tile, tile))
            return len(shift)

        us = time_graph(decode)
        line += f" | {tile.block_n}x{tile.block_k} w{tile.num_warps} s{tile.num_stages} "
        line += f"{us:.2f}{'' if ok else ' WRONG'}"
    print(line, f"({step_bytes / 1e6:.1f} MB)", flush=True)


DOWN_CANDIDATES = [DecodeTile(n, k, w, st) for (n, k), w, st in itertools.product(
    [(4, 128), (4, 256), (8, 64), (8, 128), (16, 64), (16, 128), (32, 64)], (4, 8), (2, 3, 4))]


def compare_down(tokens, x, weights, ids, w, fp8, l2, hidden, inter, experts) -> None:
    """us per decode MoE call with the measured gate_up tile and each down tile (the down
    kernel's share differs by the same amount), experts rotated past L2."""
    touched = int(torch.unique(ids).numel())
    step_bytes = touched * 3 * inter * hidden * (1 if fp8 else 2)
    copies = max(2, math.ceil(3 * l2 / step_bytes))
    shift = [torch.remainder(ids + 17 * i, experts) for i in range(copies)]
    gate_up_tile, current = decode_tile(tokens * ids.shape[1], fp8) or (None, None)
    if gate_up_tile is None:
        print(f"tokens {tokens}: past the decode kernels' buckets")
        return
    want = fused_moe_triton(x, weights, ids, w[0], w[1], w[2], decode=False).float()
    rows = []
    for tile in DOWN_CANDIDATES:
        try:
            got = fused_moe_decode(x, weights, ids, w[0], w[1], w[2], (gate_up_tile, tile))
            if not torch.allclose(got.float(), want, atol=2e-2, rtol=2e-2):
                print(f"  down {tile}: wrong result, skipped")
                continue

            def call(tile=tile):
                for ids_i in shift:
                    fused_moe_decode(x, weights, ids_i, w[0], w[1], w[2], (gate_up_tile, tile))
                return len(shift)

            rows.append((time_graph(call), tile))
        except Exception as exc:  # noqa: BLE001 - a tile that does not compile
            print(f"  down {tile}: {type(exc).__name__}, skipped")
    rows.sort(key=lambda r: r[0])
    now = next((us for us, tile in rows if tile == current), float("nan"))
    print(f"tokens {tokens} {'fp8' if fp8 else 'bf16'}: gate_up {gate_up_tile}, current down "
          f"{current} {now:.2f} us; best: " + "; ".join(
              f"{t.block_n}x{t.block_k} w{t.num_warps} s{t.num_stages} {us:.2f}"
              for us, t in rows[:5]), flush=True)


def compare_router(tokens: int, hidden: int, experts: int, top_k: int, l2: int) -> None:
    """us per routing of ``tokens`` tokens: the router's linear layer then route(), against
    route_fused; router weights rotated past L2 (a step reads them after its experts)."""
    copies = max(2, math.ceil(3 * l2 / (experts * hidden * 2)))
    gates = [torch.randn(experts, hidden, device="cuda", dtype=torch.bfloat16) / hidden**0.5
             for _ in range(copies)]
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    counter = torch.zeros(tokens, dtype=torch.int32, device="cuda")
    want = route(torch.nn.functional.linear(x, gates[0]), top_k, True)
    got = route_fused(x, gates[0], top_k, True, counter)
    same = float((got[1] == want[1]).float().mean())

    def unfused():
        for g in gates:
            route(torch.nn.functional.linear(x, g), top_k, True)
        return len(gates)

    line = f"router, {tokens} tokens: linear + route {time_graph(unfused):.2f} us"
    for rows in (1, 2, 4, 8):

        def fused(rows=rows):
            for g in gates:
                route_fused(x, g, top_k, True, counter, rows)
            return len(gates)

        line += f"; fused, {rows} rows per program {time_graph(fused):.2f} us"
    print(line + f" (same ids {100 * same:.1f}%)", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3-30b-a3b")
    p.add_argument("--tokens", default="1,8,32")
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--decode", action="store_true",
                   help="time the decode kernels (a few tiles) against the grouped path")
    p.add_argument("--down", action="store_true", help="time the decode down kernel's tiles")
    p.add_argument("--router", action="store_true",
                   help="time route_fused against the linear layer and route()")
    args = p.parse_args()
    cfg = preset_config(args.model)
    experts, hidden = cfg.num_experts, cfg.hidden_size
    inter, top_k = cfg.moe_intermediate_size, cfg.num_experts_per_tok
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    torch.manual_seed(0)
    gate_up = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16)
    gate_up /= hidden**0.5
    down = torch.randn(experts, hidden, inter, device="cuda", dtype=torch.bfloat16) / inter**0.5
    gq, gs = quantize(gate_up)
    dq, ds = quantize(down)
    began = time.monotonic()
    table: dict = {}
    print(f"{args.model}: {experts} experts, hidden {hidden}, intermediate {inter}, top {top_k}")
    if args.router:
        for tokens in [int(t) for t in args.tokens.split(",")]:
            compare_router(tokens, hidden, experts, top_k, l2)
        return 0
    for tokens in [int(t) for t in args.tokens.split(",")]:
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        weights, ids = route(torch.randn(tokens, experts, device="cuda"), top_k, True)
        weights = weights.to(torch.bfloat16)
        touched = int(torch.unique(ids).numel())
        for fp8 in (False, True):
            w = (gq, dq, (gs, ds)) if fp8 else (gate_up, down, None)
            if args.down:
                compare_down(tokens, x, weights, ids, w, fp8, l2, hidden, inter, experts)
                continue
            if args.decode:
                compare_decode(tokens, x, weights, ids, w, fp8, l2, hidden, inter, experts)
                continue
            per_byte = 1 if fp8 else 2
            step_bytes = touched * 3 * inter * hidden * per_byte
            copies = max(2, math.ceil(3 * l2 / step_bytes))

            # Each call reads other experts (ids shifted), the calls' experts together three
            # times the L2, so no call finds its weights in L2.
            shift = [torch.remainder(ids + 17 * i, experts) for i in range(copies)]

            def rotated(tiles, w=w, x=x, weights=weights, shift=shift):
                for ids_i in shift:
                    fused_moe_triton(x, weights, ids_i, w[0], w[1], w[2], tiles)
                return len(shift)

            want = fused_moe_triton(x, weights, ids, w[0], w[1], w[2],
                                    (DEFAULT_TILE, DEFAULT_TILE)).float()
            base = time_graph(lambda: rotated((DEFAULT_TILE, DEFAULT_TILE)))
            best = {"gate_up": (base, DEFAULT_TILE), "down": (base, DEFAULT_TILE)}
            for kernel, tile in itertools.product(("gate_up", "down"), TILES):
                if time.monotonic() - began > args.budget_s:
                    break
                tiles = (tile, DEFAULT_TILE) if kernel == "gate_up" else (DEFAULT_TILE, tile)
                try:
                    got = fused_moe_triton(x, weights, ids, w[0], w[1], w[2], tiles).float()
                    if not torch.allclose(got, want, atol=2e-2, rtol=2e-2):
                        print(f"  {kernel} {tile}: wrong result, skipped")
                        continue
                    us = time_graph(lambda tiles=tiles: rotated(tiles))
                except Exception as exc:  # noqa: BLE001 - a tile that does not compile
                    print(f"  {kernel} {tile}: {type(exc).__name__}, skipped")
                    continue
                if us < best[kernel][0]:
                    best[kernel] = (us, tile)
            both = (best["gate_up"][1], best["down"][1])
            combined = time_graph(lambda both=both: rotated(both))
            name = "fp8" if fp8 else "bf16"
            print(f"tokens {tokens:3d} {name}: {touched} experts, {step_bytes / 1e6:.1f} MB; "
                  f"default {base:.2f} us ({step_bytes / base / 1e6:.2f} TB/s); best "
                  f"{combined:.2f} us ({step_bytes / combined / 1e6:.2f} TB/s) "
                  f"gate_up {both[0]} down {both[1]}")
            if combined < KEEP_MARGIN * base:
                bucket = pair_bucket(tokens * top_k)
                for kernel, tile in zip(("gate_up", "down"), both, strict=True):
                    if tile != DEFAULT_TILE:
                        table[(kernel, hidden, inter, fp8, bucket)] = tile
    print("MOE_TILES = {")
    for key, tile in table.items():
        print(f"    {key!r}: MoeTile({tile.block_n}, {tile.block_k}, {tile.num_warps}, "
              f"{tile.num_stages}),")
    print("}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
