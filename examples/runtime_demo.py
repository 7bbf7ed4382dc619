"""The cadence runtime without the engine: streams, a Numba kernel bound once, a CUDA graph, event
timing, and results moved to the host through a pinned slot.

    python examples/runtime_demo.py          # on a CUDA device
    python examples/runtime_demo.py --cpu    # the CPU backend, the kernel in Numba's simulator

On the CPU the same code runs synchronously: the kernel runs in Numba's CUDA simulator, and the
"graph" is re-run eagerly (a CPU capture cannot be replayed), so the timings mean little there.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if "--cpu" in sys.argv[1:]:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba.cuda is first imported

import numpy as np  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402

from cadence.graphs import CudaGraphBackend, EagerGraphBackend, GraphRunner  # noqa: E402
from cadence.numba_kernels import TokenBuffers, make_token_kernels  # noqa: E402
from cadence.runtime import bind, get_device  # noqa: E402

ROWS, WIDTH = 64, 256


@cuda.jit
def add_bias(x, bias, n):
    """x[i, :] += bias[i] for the first n[0] rows (the count lives on the device)."""
    i = cuda.grid(1)
    if i < n[0]:
        for j in range(x.shape[1]):
            x[i, j] += bias[i]


def main() -> None:
    parser = argparse.ArgumentParser(description="the cadence runtime on its own")
    parser.add_argument("--cpu", action="store_true", help="the CPU backend and Numba's simulator")
    cpu = parser.parse_args().cpu
    dev = get_device("cpu" if cpu else "cuda")
    props = dev.properties()
    free, total = dev.mem_get_info()
    print(f"{props.name}: {props.multiprocessor_count} SMs (or cores), "
          f"{free / 2**30:.1f}/{total / 2**30:.1f} GiB free")

    main_stream = dev.create_stream()  # all compute
    copy_stream = dev.create_stream()  # device -> host copies only

    # Persistent buffers: torch owns these; the kernel is bound to them once.
    on = dev.torch_device
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, WIDTH, generator=gen).to(on)
    w = (torch.randn(WIDTH, WIDTH, generator=gen) / WIDTH**0.5).to(on)
    bias = torch.arange(ROWS, dtype=torch.float32, device=on)
    n_rows = torch.tensor([ROWS], dtype=torch.int32, device=on)
    y = torch.empty(ROWS, WIDTH, device=on)
    if not cpu:
        torch.cuda.synchronize()  # torch made them on its own stream
    args = (y, bias, n_rows) if not cpu else (y.numpy(), bias.numpy(), n_rows.numpy())
    bias_kernel = bind(add_bias, grid=1, block=ROWS, args=args)

    def step(rows: int) -> torch.Tensor:
        torch.matmul(x, w, out=y)
        bias_kernel.launch(main_stream)  # the Numba kernel on the main stream
        torch.relu_(y)
        return y

    # Eager once, then the same step as a graph on the main stream (re-run eagerly on the CPU).
    with main_stream.context():
        step(ROWS)
        expected = torch.relu(x @ w + bias[:, None])
    main_stream.synchronize()
    torch.testing.assert_close(y, expected)

    backend = EagerGraphBackend(main_stream) if cpu else CudaGraphBackend(main_stream)
    graphs = GraphRunner(step, [ROWS], backend)
    report = graphs.capture()
    print(f"captured graph: {report.kernels[ROWS]} kernels")

    # Time eager steps and graph replays with timing events on the main stream.
    start, end = dev.create_event(timing=True), dev.create_event(timing=True)
    iters = 5 if cpu else 200

    def timed(fn) -> float:
        for _ in range(iters // 10):
            fn()
        start.record(main_stream)
        for _ in range(iters):
            fn()
        end.record(main_stream)
        end.synchronize()
        return start.elapsed_ms(end) * 1e3 / iters

    with main_stream.context():
        eager_us = timed(lambda: step(ROWS))
        graph_us = timed(lambda: graphs.replay(ROWS))
    print(f"eager step {eager_us:.1f} us, graph replay {graph_us:.1f} us (device time per step)")

    t0 = time.perf_counter()
    for _ in range(iters):
        bias_kernel.launch(main_stream)
    launch_us = (time.perf_counter() - t0) * 1e6 / iters
    main_stream.synchronize()
    print(f"bound Numba kernel: {launch_us:.1f} us of host time per launch")

    # The engine's token kernels: bound once, launched on the main stream.
    bufs = TokenBuffers(
        input_ids=torch.zeros(1024, dtype=torch.int64, device=on),
        last_sampled=torch.zeros(256, dtype=torch.int64, device=on),
        req_indices=torch.arange(256, dtype=torch.int32, device=on),
        last_token_index=torch.arange(256, dtype=torch.int32, device=on),
        use_sampled=torch.ones(256, dtype=torch.int32, device=on),
        num_reqs=torch.tensor([200], dtype=torch.int32, device=on),
        sampled=torch.arange(256, dtype=torch.int64, device=on) + 7,
    )
    if not cpu:
        torch.cuda.synchronize()
    token_kernels = make_token_kernels(bufs)
    token_kernels.scatter(main_stream)
    token_kernels.combine(main_stream)
    main_stream.synchronize()
    assert bufs.input_ids[:200].tolist() == list(range(7, 207))
    print(f"combine and scatter: {type(token_kernels).__name__}")

    # Results to the host: replay with new inputs, then stage the row sums through a slot.
    pool = dev.create_slot_pool(num_slots=2, capacity=ROWS, dtype=torch.float32)
    sums = torch.empty(ROWS, device=on)
    for round_ in range(3):
        with main_stream.context():
            x.normal_()
            graphs.replay(ROWS)
            torch.sum(y, dim=1, out=sums)
            want = torch.relu(x @ w + bias[:, None]).sum(1)
        slot = pool.borrow()
        slot.stage(sums, ROWS, main=main_stream, copy=copy_stream)  # no host blocking
        host = slot.fetch(ROWS)  # waits on this slot's copy only
        pool.release(slot)
        np.testing.assert_allclose(host, want.cpu().numpy(), rtol=1e-4, atol=1e-3)
        print(f"round {round_}: row sums on the host, first three {np.round(host[:3], 3).tolist()}")

    pool.close()
    graphs.close()
    for resource in (start, end, main_stream, copy_stream):
        resource.close()
    print("runtime demo ok")


if __name__ == "__main__":
    main()
