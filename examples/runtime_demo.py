"""The cadence runtime without the engine: streams, a Numba kernel, a CUDA graph, event timing,
and results moved to the host through a pinned slot. Needs a CUDA device.

    python examples/runtime_demo.py
"""

from __future__ import annotations

import time

import numpy as np
import torch
from numba import cuda

from cadence.numba_kernels import TokenBuffers, make_token_kernels
from cadence.runtime import get_device, graph_kernel_count, launch_graph


@cuda.jit
def add_bias(x, bias, n):
    """x[i, :] += bias[i] for the first n[0] rows (the count lives on the device)."""
    i = cuda.grid(1)
    if i < n[0]:
        for j in range(x.shape[1]):
            x[i, j] += bias[i]


def main() -> None:
    dev = get_device("cuda")
    props = dev.properties()
    free, total = dev.mem_get_info()
    print(
        f"{props.name}: {props.multiprocessor_count} SMs, {free / 2**30:.1f}/{total / 2**30:.1f} GiB free"
    )

    main_stream = dev.create_stream()  # all compute
    copy_stream = dev.create_stream()  # device -> host copies only

    # Persistent buffers: torch owns these; Numba views are built once and reused.
    rows, width = 64, 256
    x = torch.randn(rows, width, device="cuda")
    w = torch.randn(width, width, device="cuda") / width**0.5
    bias = torch.arange(rows, dtype=torch.float32, device="cuda")
    n_rows = torch.tensor([rows], dtype=torch.int32, device="cuda")
    y = torch.empty(rows, width, device="cuda")
    torch.cuda.synchronize()  # torch made them on its own stream
    views = (cuda.as_cuda_array(y), cuda.as_cuda_array(bias), cuda.as_cuda_array(n_rows))
    bias_kernel = add_bias[1, rows, cuda.external_stream(main_stream.ptr)]

    def step() -> None:
        torch.matmul(x, w, out=y)
        bias_kernel(*views)  # Numba kernel on the main stream
        torch.relu_(y)

    # Eager once, then capture the same step into a graph on the main stream.
    with main_stream.context():
        step()
        expected = torch.relu(x @ w + bias[:, None])
    main_stream.synchronize()
    torch.testing.assert_close(y, expected)

    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with main_stream.context():
        graph.capture_begin(capture_error_mode="thread_local")
        step()
        graph.capture_end()
    graph.instantiate()
    exec_handle = graph.raw_cuda_graph_exec()
    print(f"captured graph: {graph_kernel_count(graph.raw_cuda_graph())} kernels")

    # Time eager steps and graph replays with timing events on the main stream.
    start, end = dev.create_event(timing=True), dev.create_event(timing=True)
    iters = 200
    with main_stream.context():
        for _ in range(20):
            step()
    start.record(main_stream)
    with main_stream.context():
        for _ in range(iters):
            step()
    end.record(main_stream)
    end.synchronize()
    eager_us = start.elapsed_ms(end) * 1e3 / iters
    for _ in range(20):
        launch_graph(exec_handle, main_stream)
    start.record(main_stream)
    for _ in range(iters):
        launch_graph(exec_handle, main_stream)
    end.record(main_stream)
    end.synchronize()
    graph_us = start.elapsed_ms(end) * 1e3 / iters
    print(f"eager step {eager_us:.1f} us, graph replay {graph_us:.1f} us (device time per step)")

    t0 = time.perf_counter()
    for _ in range(1000):
        bias_kernel(*views)
    launch_us = (time.perf_counter() - t0) * 1e3
    main_stream.synchronize()
    print(f"Numba launch with cached views: {launch_us:.1f} us of host time per launch")

    # The engine's token kernels: specialized once, launched on the main stream.
    slots = torch.zeros(256, dtype=torch.int64, device="cuda")
    bufs = TokenBuffers(
        input_ids=torch.zeros(1024, dtype=torch.int64, device="cuda"),
        last_sampled=slots,
        req_indices=torch.arange(256, dtype=torch.int32, device="cuda"),
        last_token_index=torch.arange(256, dtype=torch.int32, device="cuda"),
        use_sampled=torch.ones(256, dtype=torch.int32, device="cuda"),
        num_reqs=torch.tensor([200], dtype=torch.int32, device="cuda"),
        sampled=torch.arange(256, dtype=torch.int64, device="cuda") + 7,
    )
    torch.cuda.synchronize()
    token_kernels = make_token_kernels(bufs)
    token_kernels.scatter(main_stream)
    token_kernels.combine(main_stream)
    main_stream.synchronize()
    assert bufs.input_ids[:200].tolist() == list(range(7, 207))
    t0 = time.perf_counter()
    for _ in range(1000):
        token_kernels.combine(main_stream)
    combine_us = (time.perf_counter() - t0) * 1e3
    main_stream.synchronize()
    path = "direct kernel launch" if token_kernels.direct_launch else "dispatcher"
    print(f"combine launch ({path}, cached views): {combine_us:.1f} us of host time")

    # Results to the host: replay with new inputs, then stage the row sums through a slot.
    pool = dev.create_slot_pool(num_slots=2, capacity=rows, dtype=torch.float32)
    sums = torch.empty(rows, device="cuda")
    for round_ in range(3):
        with main_stream.context():
            x.normal_()
        launch_graph(exec_handle, main_stream)
        with main_stream.context():
            torch.sum(y, dim=1, out=sums)
            want = torch.relu(x @ w + bias[:, None]).sum(1)
        slot = pool.borrow()
        slot.stage(sums, rows, main=main_stream, copy=copy_stream)  # no host blocking
        host = slot.fetch(rows)  # waits on this slot's copy only
        pool.release(slot)
        np.testing.assert_allclose(host, want.cpu().numpy(), rtol=1e-4, atol=1e-3)
        print(f"round {round_}: row sums on the host, first three {np.round(host[:3], 3).tolist()}")

    pool.close()
    graph.reset()
    for resource in (start, end, main_stream, copy_stream):
        resource.close()
    print("runtime demo ok")


if __name__ == "__main__":
    main()
