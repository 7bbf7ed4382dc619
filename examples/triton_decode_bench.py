"""Microbenchmark of the Triton paged decode attention (KV store + attention, as the model calls
it) at Qwen3-0.6B head shapes: 16 query heads, 8 kv heads, head_dim 128, bf16, block size 16.

Each timed unit is a CUDA graph that runs the backend over ``R`` different block tables into a
cache much larger than the L2, so successive calls read cold memory; the figure per call is the
graph's time over ``R`` (median of replays). Bandwidth counts the K and V bytes that must be read.

    python examples/triton_decode_bench.py [--json out.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.attention_tiles import choose_num_splits
from cadence.model.triton_attention import paged_decode_attention
from cadence.model.triton_backend import TritonAttentionBackend

HEADS, KV_HEADS, DIM, PAGE = 16, 8, 128, 16
HBM_READ_TBPS = 4.11  # measured on the H200 (docs/perf.md, DESIGN.md)


def make_metadata(batch: int, ctx: int, num_blocks: int, gen: torch.Generator) -> AttentionMetadata:
    width = ctx // PAGE
    tables = torch.randperm(num_blocks - 1, generator=gen)[: batch * width] + 1
    tables = tables.view(batch, width).int()
    last = tables[:, -1].long() * PAGE + PAGE - 1
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32)
    qsl = torch.arange(batch + 1, dtype=torch.int32)
    return AttentionMetadata(
        num_actual_tokens=batch,
        max_query_len=1,
        max_seq_len=ctx,
        query_start_loc=qsl.cuda(),
        seq_lens=seq_lens.cuda(),
        block_tables=tables.cuda(),
        slot_mapping=last.cuda(),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
    )


def time_graph(
    fn: Callable[[], None], stream: torch.cuda.Stream, rotations: int, replays: int
) -> tuple[float, float]:
    """Median device time per rotation of a graph of ``fn`` (and the replays' relative spread)."""
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / rotations)
    graph.reset()
    us = statistics.median(times)
    return us, (max(times) - min(times)) / us


def bench_prefill(batch: int, prompt: int, backend: TritonAttentionBackend) -> dict[str, float]:
    gen = torch.Generator().manual_seed(batch + prompt)
    blocks = batch * prompt // PAGE
    cache = torch.randn(2, blocks + 1, PAGE, KV_HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    tables = (torch.randperm(blocks, generator=gen) + 1).view(batch, -1).int()
    pos = torch.arange(prompt)
    slots = (tables.long()[:, pos // PAGE] * PAGE + pos % PAGE).reshape(-1)
    qsl = torch.arange(batch + 1, dtype=torch.int32) * prompt
    seq_lens = torch.full((batch,), prompt, dtype=torch.int32)
    md = AttentionMetadata(
        batch * prompt, prompt, prompt, qsl.cuda(), seq_lens.cuda(), tables.cuda(),
        slots.cuda(), qsl, seq_lens,
    )  # fmt: skip
    tokens = batch * prompt
    q = torch.randn(tokens, HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(tokens, KV_HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    us, _ = time_graph(lambda: backend.forward(q, k, v, cache, md, DIM**-0.5), stream, 1, 10)
    flops = 2 * 2 * HEADS * DIM * batch * prompt * (prompt + 1) / 2  # causal QK^T and PV
    return {"batch": batch, "prompt": prompt, "us": us, "tflops": flops / (us * 1e-6) / 1e12}


def bench(batch: int, ctx: int, backend: TritonAttentionBackend, replays: int) -> dict[str, float]:
    gen = torch.Generator().manual_seed(batch * 7919 + ctx)
    kv_bytes = batch * ctx * KV_HEADS * DIM * 2 * 2  # K and V, bf16
    rotations = max(1, min(256, (1 << 30) // kv_bytes))
    blocks_per_set = batch * ctx // PAGE
    num_blocks = blocks_per_set * rotations + 1
    cache = torch.randn(2, num_blocks, PAGE, KV_HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    metas = [make_metadata(batch, ctx, num_blocks, gen) for _ in range(rotations)]
    q = torch.randn(batch, HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch, KV_HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    scale = DIM**-0.5

    def run_all() -> None:
        for md in metas:
            backend.forward(q, k, v, cache, md, scale)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_all()
    torch.cuda.synchronize()
    # Wall time of one eager call: the Triton launch path's host cost, or the GPU time if larger.
    t0 = time.perf_counter()
    for _ in range(50):
        backend.forward(q, k, v, cache, metas[0], scale)
    torch.cuda.synchronize()
    eager_us = (time.perf_counter() - t0) / 50 * 1e6

    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = choose_num_splits(batch, KV_HEADS, ctx, num_sms)
    alt = splits * 2 if splits > 1 else 2
    out = torch.empty_like(q)

    def run_alt() -> None:
        for md in metas:
            paged_decode_attention(q, cache, md, scale, out, num_sms, alt, k, v)

    us, spread = time_graph(run_all, stream, rotations, replays)
    alt_us, _ = time_graph(run_alt, stream, rotations, replays)
    gbps = kv_bytes / (us * 1e-6) / 1e9
    return {
        "batch": batch,
        "context": ctx,
        "splits": splits,
        "alt_splits": alt,
        "alt_us_per_call": alt_us,
        "rotations": rotations,
        "us_per_call": us,
        "spread": spread,
        "kv_mb": kv_bytes / 1e6,
        "gb_per_s": gbps,
        "fraction_of_hbm": gbps / (HBM_READ_TBPS * 1e3),
        "eager_us": eager_us,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="one decode and one prefill shape")
    args = parser.parse_args()
    backend = TritonAttentionBackend()
    rows = []
    shapes = [(1, 256)] if args.quick else [(b, c) for b in (1, 32, 128) for c in (256, 1024, 4096)]
    for batch, ctx in shapes:
        rows.append(bench(batch, ctx, backend, args.replays))
        torch.cuda.empty_cache()
    prompts = ((8, 512),) if args.quick else ((1, 4096), (8, 512), (32, 128))
    prefill = [bench_prefill(b, p, backend) for b, p in prompts]
    info = {
        "prefill": prefill,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=2)
    print(f"{info['device']}, decode attention, 16q/8kv heads, d=128, bf16, block 16")
    print("batch  ctx   splits  us/call  KV MB    GB/s   of HBM  spread eager us (splits: us)")
    for r in rows:
        print(
            f"{r['batch']:5d} {r['context']:5d} {r['splits']:6d} {r['us_per_call']:8.2f}"
            f" {r['kv_mb']:7.1f} {r['gb_per_s']:7.0f} {r['fraction_of_hbm']:7.0%}"
            f" {r['spread']:6.1%} {r['eager_us']:8.1f}"
            f"  ({r['alt_splits']}: {r['alt_us_per_call']:.2f})"
        )
    print("prefill (store + causal attention), bf16: batch x prompt, us, TFLOP/s")
    for r in info["prefill"]:
        print(f"{r['batch']:5d} x {r['prompt']:5d} {r['us']:9.1f} {r['tflops']:7.1f}")


if __name__ == "__main__":
    main()
