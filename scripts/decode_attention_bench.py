"""Time the decode attention launch (the paged decode kernel, with the new K/V stored and the
q/k norms and RoPE applied in its loads, plus the merge of its splits) as a decode step runs it
(GPU), inside a CUDA graph.

    python scripts/decode_attention_bench.py [--batches 1,8,64] [--contexts 256,1024]
        [--layers 28] [--max-model-len 4096] [--sweep] [--layout token|head] [--page 16]
        [--shuffle]

Qwen3-0.6B's attention shapes (16 query heads, 8 kv heads, head size 128, bf16, 16-token
pages). Per (batch, context): calls back to back in one graph, each on its own layer's cache
(``--layers``, or more: the caches fill three times the L2, since in a step the layers' weights
evict each layer's keys before the next step), block tables as wide as ``--max-model-len`` (the
split count depends on that width). Prints us per call, the split count, and the KV bytes a
call reads. With --sweep also, per case: the split counts 1 ... 64 at the default tile, then
every tile of ``TILES`` at the default and the best split count, and the fastest of all.
``--layout head`` lays each page out head by head (``[2, blocks, kv_heads, page, head_dim]``
seen through a ``[2, blocks, page, kv_heads, head_dim]`` view: one head's keys of a page are
contiguous); ``--shuffle`` hands out the pages in a random order.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from skinny_gemm_sweep import time_calls  # noqa: E402

from cadence.model.attention_metadata import AttentionMetadata, QKRope  # noqa: E402
from cadence.model.attention_tiles import (  # noqa: E402
    DecodeConfig,
    choose_num_splits,
    decode_config,
)
from cadence.model.triton_attention import paged_decode_attention  # noqa: E402

HEADS, KV_HEADS, DIM = 16, 8, 128
TILES = [DecodeConfig(n, w, st) for n in (32, 64, 128) for w in (2, 4, 8) for st in (1, 2, 3)]


def _cache(num_blocks: int, page: int, layout: str) -> torch.Tensor:
    if layout == "head":
        return torch.randn(2, num_blocks, KV_HEADS, page, DIM, dtype=torch.bfloat16,
                           device="cuda").transpose(2, 3)
    return torch.randn(2, num_blocks, page, KV_HEADS, DIM, dtype=torch.bfloat16, device="cuda")


def _case(batch: int, context: int, max_model_len: int, layers: int, page: int = 16,
          layout: str = "token", shuffle: bool = False):
    width = -(-max_model_len // page)
    used = -(-context // page)
    order = torch.randperm(batch * used) if shuffle else torch.arange(batch * used)
    tables = (1 + order).to(torch.int32).view(batch, used)
    tables = torch.nn.functional.pad(tables, (0, width - used)).cuda()
    num_blocks = batch * used + 1
    # At least three L2s of caches, as a step's weights evict each layer's keys from L2.
    cache_bytes = 2 * num_blocks * page * KV_HEADS * DIM * 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = max(layers, -(-3 * l2 // cache_bytes))
    caches = [_cache(num_blocks, page, layout) for _ in range(copies)]
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    pos = seq_lens.long() - 1
    slots = (tables[:, (context - 1) // page].long() * page + (context - 1) % page)
    md = AttentionMetadata(
        num_actual_tokens=batch, max_query_len=1, max_seq_len=context,
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
        seq_lens=seq_lens, block_tables=tables, slot_mapping=slots,
    )  # fmt: skip
    q = torch.randn(batch, HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch, KV_HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(batch, KV_HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    table = torch.randn(max_model_len, DIM, dtype=torch.bfloat16, device="cuda")
    weights = [torch.rand(DIM, dtype=torch.bfloat16, device="cuda") + 0.5 for _ in range(2)]
    rope = QKRope(pos, table, weights[0], weights[1], 1e-6)
    out = torch.empty_like(q)
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def calls(splits: int, cfg: DecodeConfig | None) -> list:
        return [functools.partial(paged_decode_attention, q, c, md, DIM**-0.5, out, sms, splits,
                                  k, v, rope=rope, config=cfg) for c in caches]

    return calls, choose_num_splits(batch, KV_HEADS, width * page, sms)


def _time(calls: list, total: int) -> float:
    try:
        return time_calls(calls, total)
    except Exception as exc:  # a tile past the shared memory: skipped
        print(f"    skipped: {type(exc).__name__}: {str(exc)[:80]}")
        return float("inf")


def _sweep(calls, auto: int, total: int) -> str:
    base = decode_config(False)
    by_splits = {s: _time(calls(s, base), total) for s in (1, 2, 4, 8, 16, 32, 64)}
    best_s = min(by_splits, key=by_splits.get)
    timed = {(s, base): us for s, us in by_splits.items()}
    for s in {auto, best_s}:
        for cfg in TILES:
            if (s, cfg) not in timed:
                timed[(s, cfg)] = _time(calls(s, cfg), total)
    (s, cfg), us = min(timed.items(), key=lambda item: item[1])
    row = " ".join(f"{s}:{us:.2f}" for s, us in by_splits.items())
    return (f"    splits at the default tile: {row}\n"
            f"    fastest: {us:.2f} us, {s} splits, block_n {cfg.block_n}, "
            f"{cfg.num_warps} warps, {cfg.num_stages} stages")


def _positive_ints(text: str) -> list[int]:
    """A comma-separated list of positive integers (argparse reports anything else)."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"every value must be at least 1: {text!r}")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=_positive_ints, default=[1, 8, 64])
    parser.add_argument("--contexts", type=_positive_ints, default=[256, 1024])
    parser.add_argument("--layers", type=lambda t: _positive_ints(t)[0], default=28)
    parser.add_argument("--max-model-len", type=lambda t: _positive_ints(t)[0], default=4096)
    parser.add_argument("--calls", type=lambda t: _positive_ints(t)[0], default=5600)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--layout", choices=("token", "head"), default="token")
    parser.add_argument("--page", type=lambda t: _positive_ints(t)[0], default=16)
    parser.add_argument("--shuffle", action="store_true")
    ns = parser.parse_args()
    print(f"layout {ns.layout}, page {ns.page}, shuffled pages {ns.shuffle}")
    print("batch  context  splits  us_per_call  kv_MB_per_call")
    for batch in ns.batches:
        for context in ns.contexts:
            calls, splits = _case(batch, context, ns.max_model_len, ns.layers, ns.page,
                                  ns.layout, ns.shuffle)
            us = time_calls(calls(splits, None), ns.calls)  # the launch's own tile
            kv_mb = batch * context * KV_HEADS * DIM * 2 * 2 / 1e6
            print(f"{batch:5d}  {context:7d}  {splits:6d}  {us:11.2f}  {kv_mb:14.2f}", flush=True)
            if ns.sweep:
                print(_sweep(calls, splits, ns.calls // 2), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
