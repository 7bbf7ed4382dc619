"""All-reduce latency by message size on 2+ GPUs: NCCL against cadence's one-shot custom
all-reduce, both inside CUDA graphs as the decode steps run them.

    python scripts/allreduce_bench.py [--world 2] [--dtype bfloat16] [--min-kib 4] [--max-kib 1024]
                                      [--calls 50] [--replays 20]

One process per GPU. For each size, one graph of ``--calls`` all-reduces of the same tensor is
captured per path and replayed ``--replays`` times; a figure is the replays' time divided by the
number of all-reduces (launches inside the graph included). Rank 0 prints the table (and the
largest difference between the two paths' results on random inputs, as a sanity figure).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _time_in_graph(fn: Any, calls: int, replays: int) -> float:
    """Microseconds per ``fn()`` over ``replays`` replays of a graph of ``calls`` of it."""
    import torch
    import torch.distributed as dist

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    graph.reset()
    return start.elapsed_time(end) * 1000.0 / (replays * calls)


def _sanity(car: Any, numel: int, dtype: Any) -> float:
    """Largest |custom - NCCL| on random inputs of ``numel`` elements."""
    import torch
    import torch.distributed as dist

    x = torch.randn(numel, device="cuda").to(dtype)
    y = x.clone()
    car.all_reduce(x)
    dist.all_reduce(y)
    return float((x.float() - y.float()).abs().max())


def _rank(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from cadence.model.custom_all_reduce import CustomAllReduce

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=device)
    dtype = getattr(torch, args.dtype)
    sizes = []
    kib = args.min_kib
    while kib <= args.max_kib:
        sizes.append(kib * 1024)
        kib *= 2
    car = CustomAllReduce.create(rank, max_bytes=max(sizes))
    if car is None:
        raise SystemExit("the custom all-reduce could not be set up here (see the log)")
    rows = []
    for nbytes in sizes:
        x = torch.zeros(nbytes // _element_size(dtype), dtype=dtype, device=device)
        nccl = _time_in_graph(lambda t=x: dist.all_reduce(t), args.calls, args.replays)
        custom = _time_in_graph(lambda t=x: car.all_reduce(t), args.calls, args.replays)
        diff = _sanity(car, x.numel(), dtype)
        rows.append((nbytes, nccl, custom, diff))
    if rank == 0:
        name = torch.cuda.get_device_name(rank)
        print(f"all-reduce, {world} x {name}, {args.dtype}, inside CUDA graphs "
              f"({args.calls} per graph, {args.replays} replays)")
        print(f"{'size':>10} {'NCCL us':>9} {'custom us':>10} {'speed-up':>9} {'max |diff|':>11}")
        for nbytes, nccl, custom, diff in rows:
            size = f"{nbytes // 1024} KiB" if nbytes < 1 << 20 else f"{nbytes >> 20} MiB"
            print(f"{size:>10} {nccl:9.2f} {custom:10.2f} {nccl / custom:8.2f}x {diff:11.3g}")
    sys.stdout.flush()
    dist.barrier()
    torch.cuda.synchronize()
    car.close()
    os._exit(0)  # no process-group teardown: it can hang


def _element_size(dtype: Any) -> int:
    import torch

    return torch.tensor([], dtype=dtype).element_size()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2, help="GPUs (2 to 8)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--min-kib", type=int, default=4)
    parser.add_argument("--max-kib", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=50, help="all-reduces per graph")
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()

    import torch
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < args.world:
        raise SystemExit(f"needs {args.world} CUDA devices, found {torch.cuda.device_count()}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(args.world, port, args), nprocs=args.world, join=True,
                       start_method="spawn")


if __name__ == "__main__":
    main()
