"""One rank of the custom all-reduce GPU test (run by torch.multiprocessing, one process per
GPU): every check compares with the float64 sum of every rank's input, which each rank makes
from the same seeds, and with the other ranks' results bit for bit."""

from __future__ import annotations

import os
import sys
import traceback

import torch
import torch.distributed as dist

from cadence.model import parallel

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def inputs(seed: int, shape: tuple[int, ...], dtype: torch.dtype,
           world: int) -> list[torch.Tensor]:
    """Every rank's input of one check (on the CPU)."""
    out = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 97 + r)
        out.append(torch.randn(shape, generator=g, dtype=torch.float32).to(dtype))
    return out


def expect(result: torch.Tensor, parts: list[torch.Tensor], what: str, scale: float = 1.0,
           same_bits: bool = True) -> None:
    want = sum(p.double() for p in parts) * scale
    tol = TOLERANCE[result.dtype]
    got = result.double().cpu()
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * 4, msg=lambda m: f"{what}: {m}")
    if not same_bits:
        return
    gathered = [torch.empty_like(result) for _ in range(len(parts))]
    dist.all_gather(gathered, result.contiguous())
    for r, other in enumerate(gathered):
        assert torch.equal(other, result), f"{what}: rank {r}'s result differs from this rank's"


def random_shapes(world: int, rank: int, max_bytes: int) -> None:
    car = parallel._custom
    gen = torch.Generator().manual_seed(1234)  # the same shapes on every rank
    for case in range(60):
        dtype = DTYPES[case % 3]
        size = torch.tensor([], dtype=dtype).element_size()
        cols = 16 // size * int(torch.randint(1, 1024, (1,), generator=gen))  # whole vectors
        rows = int(torch.randint(1, 64, (1,), generator=gen))
        rows = max(1, min(rows, max_bytes // (cols * size)))
        parts = inputs(case, (rows, cols), dtype, world)
        x = parts[rank].cuda()
        assert car.should_use(x), (rows, cols, dtype)
        before = car.launches
        parallel.all_reduce(x)
        assert car.launches == before + 1
        expect(x, parts, f"case {case} {dtype} {(rows, cols)}")


def repeated_calls(world: int, rank: int) -> None:
    # Alternating grids (1 block, the cap) and dtypes, with no host sync between calls.
    shapes = [((1, 8), torch.bfloat16), ((64, 4096), torch.bfloat16), ((3, 1000), torch.float32),
              ((1, 4096), torch.float16)]
    pending = []
    for i in range(200):
        shape, dtype = shapes[i % len(shapes)]
        parts = inputs(10_000 + i, shape, dtype, world)
        x = parts[rank].cuda()
        parallel.all_reduce(x)
        pending.append((x, parts, i))
    for x, parts, i in pending:
        expect(x, parts, f"call {i}")


def fallbacks(world: int, rank: int) -> None:
    car = parallel._custom
    base = inputs(7, (4097,), torch.float32, world)
    x = base[rank].cuda()[1:]  # 16 KiB at an address 4 bytes past alignment: an aligned copy
    assert car.should_use(x) and x.data_ptr() % 16
    parallel.all_reduce(x)
    expect(x, [b[1:] for b in base], "misaligned view")
    for shape, dtype in (((7,), torch.float32), ((300, 1024), torch.float32),
                         ((5,), torch.float64)):
        parts = inputs(8, shape, dtype, world)
        x = parts[rank].cuda()
        assert not car.should_use(x)
        parallel.all_reduce(x)  # NCCL's
        torch.testing.assert_close(x.cpu(), sum(p.double() for p in parts).to(dtype))


def graph_replays(world: int, rank: int) -> None:
    shapes = [((1, 4096), torch.bfloat16), ((8, 4096), torch.float16),
              ((64, 4096), torch.bfloat16), ((4, 1000), torch.float32),
              ((256, 1024), torch.float32)]  # the last one is NCCL's, inside the same graph
    static = [torch.zeros(s, dtype=d, device="cuda") for s, d in shapes]
    twice = torch.zeros((2, 512), dtype=torch.float32, device="cuda")
    car = parallel._custom
    assert [car.should_use(t) for t in static] == [True] * 4 + [False]

    def step() -> None:
        for t in static:
            parallel.all_reduce(t)
        parallel.all_reduce(twice)
        twice.mul_(0.5)
        parallel.all_reduce(twice)  # two calls on one tensor inside one graph

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up, eagerly
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for replay in range(6):
        parts = [inputs(100 * replay + i, s, d, world) for i, (s, d) in enumerate(shapes)]
        twice_parts = inputs(100 * replay + 99, (2, 512), torch.float32, world)
        for t, p in zip(static, parts, strict=True):
            t.copy_(p[rank])
        twice.copy_(twice_parts[rank])
        graph.replay()
        if replay % 2:  # eager calls between replays share the call numbers on the device
            extra = inputs(5000 + replay, (2, 4096), torch.bfloat16, world)
            y = extra[rank].cuda()
            parallel.all_reduce(y)
            expect(y, extra, f"eager call after replay {replay}")
        torch.cuda.synchronize()
        for i, (t, p) in enumerate(zip(static, parts, strict=True)):
            expect(t, p, f"replay {replay}, tensor {i}", same_bits=i < len(static) - 1)
        expect(twice, twice_parts, f"replay {replay}, reduced twice", scale=0.5 * world)
    graph.reset()


def run(rank: int, world: int, port: int) -> None:
    """The whole check on one rank; exits the process (no process-group teardown)."""
    try:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, device_id=device)
        car = parallel.setup_custom_all_reduce(device, timeout_s=60.0)
        assert car is not None, "the custom all-reduce was not set up (see the log)"
        random_shapes(world, rank, car.max_bytes)
        repeated_calls(world, rank)
        fallbacks(world, rank)
        graph_replays(world, rank)
        torch.cuda.synchronize()
        parallel.close_custom_all_reduce()
        assert car.closed and parallel._custom is None
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)
