"""Host cost of one kernel launch: cadence's launcher against Numba's and Triton's own launches.

Each row launches the same kernel on the same runtime stream ``--launches`` times in a loop
and reports the host time per launch (median of ``--repeats`` loops; the stream is drained
between loops so that a full launch queue never blocks a loop). The goal for the launcher is
5 us or less. Needs a CUDA device.

    python scripts/launch_cost.py [--launches 256] [--repeats 9] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOAL_US = 5.0


def per_launch_us(launch: Callable[[], None], stream: Any, launches: int, repeats: int) -> float:
    launch()  # compile, load and bind outside the timing
    stream.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(launches):
            launch()
        samples.append((time.perf_counter() - t0) / launches * 1e6)
        stream.synchronize()
    return statistics.median(samples)


def numba_rows(stream: Any) -> dict[str, Callable[[], None]]:
    import torch
    from numba import cuda

    from cadence.numba_kernels import kernels
    from cadence.runtime import bind

    rows = 256
    t = {
        "input_ids": torch.zeros(1024, dtype=torch.int64, device="cuda"),
        "last_sampled": torch.zeros(rows, dtype=torch.int64, device="cuda"),
        "req_indices": torch.arange(rows, dtype=torch.int32, device="cuda"),
        "last_token_index": torch.arange(rows, dtype=torch.int32, device="cuda"),
        "use_sampled": torch.ones(rows, dtype=torch.int32, device="cuda"),
        "count": torch.tensor([200], dtype=torch.int32, device="cuda"),
    }
    torch.cuda.synchronize()
    views = tuple(cuda.as_cuda_array(x) for x in t.values())
    blocks, threads = 2, kernels.THREADS_PER_BLOCK
    configured = kernels.combine_kernel[blocks, threads, cuda.external_stream(stream.ptr)]
    specialized = kernels.combine_kernel.specialize(*views)
    compiled = next(iter(specialized.overloads.values()))
    nb_stream = configured.stream
    bound = bind(kernels.combine_kernel, blocks, threads, views)
    return {
        "numba: kernel[grid, block, stream](*views)": lambda: configured(*views),
        "numba: specialized kernel.launch (views cached)":
            lambda: compiled.launch(views, (blocks, 1, 1), (threads, 1, 1), nb_stream, 0),
        "cadence: bind(numba kernel).launch(stream)": lambda: bound.launch(stream),
    }


def triton_rows(stream: Any) -> dict[str, Callable[[], None]]:
    import torch
    import triton
    import triton.language as tl

    from cadence.runtime import bind
    from cadence.runtime.triton_launch import TritonLaunch

    @triton.jit
    def axpy(x_ptr, y_ptr, out_ptr, n, a, BLOCK: tl.constexpr):  # noqa: N803
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, a * x + y, mask=mask)

    n = 4096
    x, y, out = (torch.randn(n, device="cuda") for _ in range(3))
    torch.cuda.synchronize()
    grid = (triton.cdiv(n, 1024),)
    args = (x, y, out, n, 2.0)
    fast = TritonLaunch(axpy)
    bound = bind(axpy, grid, args=args, BLOCK=1024, num_warps=4)

    def own() -> None:
        axpy[grid](*args, BLOCK=1024, num_warps=4)

    def fast_path() -> None:
        fast(grid, args, num_warps=4, BLOCK=1024)

    # Triton's own launches go to torch's current stream: main() measures inside
    # stream.context(), so every row launches on the same stream.
    return {
        "triton: kernel[grid](...)": own,
        "cadence: TritonLaunch (Triton's C launcher)": fast_path,
        "cadence: bind(triton kernel).launch(stream)": lambda: bound.launch(stream),
    }


def nvrtc_rows(stream: Any, dev: Any) -> dict[str, Callable[[], None]]:
    from cadence.runtime import Module, bind_function

    src = r"""extern "C" __global__ void add(int *x, int n, int v) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += v; }"""
    mod = Module.from_source(src)
    buf = dev.alloc_device(4096)
    bound = bind_function(mod.function("add"), 4, 256,
                          (buf, ctypes.c_int32(1024), ctypes.c_int32(1)))
    rows = {"cadence: bind_function(NVRTC kernel).launch(stream)": lambda: bound.launch(stream)}
    try:  # cuda.core's launch takes the cadence stream as it is (the stream protocol)
        from cuda.core import Kernel, LaunchConfig, launch

        kernel = Kernel.from_handle(int(bound.function))
    except Exception:  # cuda.core versions differ; the row is a courtesy
        return rows
    config = LaunchConfig(grid=4, block=256)
    ptr, n, v = bound.params.values
    address = np.uintp(ptr.value)  # cuda.core takes numpy scalars, not ctypes pointers
    rows["cuda.core: launch(cadence stream, ...)"] = lambda: launch(stream, config, kernel,
                                                                    address, n, v)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launches", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    opts = parser.parse_args()

    import torch

    from cadence.runtime import get_device

    dev = get_device("cuda")
    stream = dev.create_stream()
    results: dict[str, float | str] = {}
    sections: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("numba", lambda: numba_rows(stream)),
        ("triton", lambda: triton_rows(stream)),
        ("nvrtc", lambda: nvrtc_rows(stream, dev)),
    ]
    with stream.context():
        for name, make in sections:
            try:
                rows = make()
            except Exception as exc:  # a missing toolkit piece must not hide the other figures
                results[f"{name}: not measured"] = f"{type(exc).__name__}: {exc}"
                continue
            for label, fn in rows.items():
                try:
                    results[label] = per_launch_us(fn, stream, opts.launches, opts.repeats)
                except Exception as exc:
                    results[label] = f"failed: {type(exc).__name__}: {exc}"
    props = dev.properties()
    meta = {"device": props.name, "torch": torch.__version__, "launches": opts.launches,
            "repeats": opts.repeats, "goal_us": GOAL_US}
    if opts.json:
        print(json.dumps({"meta": meta, "us_per_launch": results}, indent=2))
        return
    print(f"host us per launch on {props.name} (median of {opts.repeats} x {opts.launches})")
    for label, value in results.items():
        if isinstance(value, float):
            mark = "  <= goal" if label.startswith("cadence: bind") and value <= GOAL_US else ""
            print(f"  {label:<52} {value:8.2f}{mark}")
        else:
            print(f"  {label:<52} {value}")
    stream.close()


if __name__ == "__main__":
    main()
