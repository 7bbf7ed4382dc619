"""Time the varlen attention kernel over tile configurations (GPU).

    python scripts/attention_sweep.py [--heads 16 --kv-heads 8 --head-dim 128]
        [--programs 8,16,33,65]   # the default tile at other programs per kv head

Cases: one prompt prefilled from scratch (128, 1024, 4096 tokens), the 1024-token prompt in a
graph bucket of 256 rows (255 padding rows, as a server's mixed-step graph holds it) and a mixed
step (a 512-token chunk beside 64 decodes at 1000 tokens of context). Grids are sized for the
device's SMs, as the engine sizes them. Prints us per call and TFLOP/s of the
causal attention work for each configuration, the default marked.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make(seqs: list[tuple[int, int]], heads: int, kv_heads: int, dim: int, page: int = 16):
    import torch

    from cadence.model.attention_metadata import AttentionMetadata

    blocks = [-(-s // page) for s, _ in seqs]
    num_blocks = sum(blocks) + 1
    width = max(blocks)
    tables = torch.zeros(len(seqs), width, dtype=torch.int32)
    start = 1
    for i, nb in enumerate(blocks):
        tables[i, :nb] = torch.arange(start, start + nb, dtype=torch.int32)
        start += nb
    q_lens = [q for _, q in seqs]
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    t = int(qsl[-1])
    cache = torch.randn(2, num_blocks, page, kv_heads, dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(t, heads, dim, dtype=torch.bfloat16, device="cuda")
    md = AttentionMetadata(
        num_actual_tokens=t, max_query_len=max(q_lens), max_seq_len=max(s for s, _ in seqs),
        query_start_loc=qsl.cuda(), seq_lens=torch.tensor([s for s, _ in seqs],
                                                          dtype=torch.int32).cuda(),
        block_tables=tables.cuda(), slot_mapping=torch.zeros(t, dtype=torch.int64).cuda(),
    )  # fmt: skip
    flops = sum(4 * heads * dim * (q * (s - q) + q * (q + 1) / 2) for s, q in seqs)
    return q, cache, md, flops


def main() -> int:
    import torch
    from triton.testing import do_bench

    from cadence.model.attention_tiles import VarlenConfig, varlen_config
    from cadence.model.triton_attention import paged_varlen_attention

    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--programs", default="",
                   help="comma-separated programs per kv head to time the default tile at "
                        "(the walk's P), beside the engine's choice")
    ns = p.parse_args()
    cases = {
        "prefill 128": [(128, 128)],
        "prefill 1024": [(1024, 1024)],
        "prefill 4096": [(4096, 4096)],
        "prefill 1024, 256-row bucket": [(1024, 1024)] + [(0, 0)] * 255,
        "chunk 512 + 64 decodes": [(1536, 512)] + [(1000, 1)] * 64,
    }
    configs = [VarlenConfig(m, n, w, s) for m, n, w, s in
               itertools.product((32, 64, 128), (32, 64, 128), (4, 8), (2, 3))]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for label, seqs in cases.items():
        q, cache, md, flops = make(seqs, ns.heads, ns.kv_heads, ns.head_dim)
        out = torch.empty_like(q)
        default = varlen_config(q.shape[0], False)
        rows = []
        for cfg in configs:
            try:
                call = functools.partial(paged_varlen_attention, q, cache, md, 0.088, out, cfg,
                                         num_sms=sms)
                us = do_bench(call, warmup=10, rep=40) * 1e3
            except Exception as exc:  # out of shared memory or registers
                print(f"{label}: {cfg} failed: {type(exc).__name__}")
                continue
            rows.append((us, cfg))
        rows.sort(key=lambda r: r[0])
        print(f"\n== {label}: {q.shape[0]} tokens, {flops / 1e9:.2f} GFLOP")
        for us, cfg in rows[:6] + [r for r in rows if r[1] == default]:
            mark = " (default)" if cfg == default else ""
            print(f"{us:9.1f} us  {flops / us / 1e6:7.1f} TFLOP/s  {cfg}{mark}")
        for programs in [int(x) for x in ns.programs.split(",") if x]:
            call = functools.partial(paged_varlen_attention, q, cache, md, 0.088, out, default,
                                     programs=programs)
            us = do_bench(call, warmup=10, rep=40) * 1e3
            print(f"{us:9.1f} us  {flops / us / 1e6:7.1f} TFLOP/s  default tile, "
                  f"{programs} programs per kv head")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
