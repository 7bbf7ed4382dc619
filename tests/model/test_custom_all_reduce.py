"""The custom all-reduce's host-side logic: which calls take it, when it is set up, the IPC
handle marshalling, the collective fallback, and the kernel source compiling for every size."""

from __future__ import annotations

import ctypes
import logging
import socket
from contextlib import nullcontext
from typing import Any

import pytest
import torch

from cadence.model import custom_all_reduce as car
from cadence.model import parallel
from cadence.model.custom_all_reduce_kernel import MAX_BLOCKS, MAX_RANKS, STAGE_OFFSET, THREADS
from cadence.runtime import ipc

MAX = 512 * 1024


@pytest.mark.parametrize(("nbytes", "dtype", "contiguous", "expected"), [
    (16, torch.float32, True, True),
    (8192, torch.bfloat16, True, True),
    (MAX, torch.float16, True, True),
    (MAX + 16, torch.bfloat16, True, False),  # past the staging halves: NCCL
    (0, torch.float32, True, False),
    (24, torch.float32, True, False),  # not whole 16-byte vectors
    (64, torch.float32, False, False),
    (64, torch.float64, True, False),
    (64, torch.int32, True, False),
])
def test_which_tensors_take_the_kernel(nbytes, dtype, contiguous, expected) -> None:
    assert car.eligible(nbytes, dtype, contiguous, MAX) is expected


def test_the_grid_follows_the_size_up_to_a_cap() -> None:
    assert car.grid_blocks(1, 36) == 1
    assert car.grid_blocks(THREADS, 36) == 1
    assert car.grid_blocks(THREADS + 1, 36) == 2
    assert car.grid_blocks(MAX // 16, 36) == 36
    assert car.grid_blocks(MAX // 16, MAX_BLOCKS) == MAX_BLOCKS


def test_buffer_layout_holds_two_aligned_halves() -> None:
    half, total = car.buffer_bytes(MAX)
    assert half == MAX and total == STAGE_OFFSET + 2 * MAX
    half, total = car.buffer_bytes(1000)
    assert half == 1024 and half % 256 == 0 and total == STAGE_OFFSET + 2048


def test_when_it_is_set_up() -> None:
    assert car.unavailable_reason("cuda", 2, False) is None
    assert car.unavailable_reason("cuda", MAX_RANKS, False) is None
    assert "CADENCE_DISABLE_CUSTOM_ALL_REDUCE" in car.unavailable_reason("cuda", 2, True)
    assert "not on CUDA" in car.unavailable_reason("cpu", 2, False)
    assert "1 ranks" in car.unavailable_reason("cuda", 1, False)
    assert "9 ranks" in car.unavailable_reason("cuda", MAX_RANKS + 1, False)


@pytest.mark.parametrize(("value", "disabled"),
                         [(None, False), ("", False), ("0", False), ("1", True), ("true", True),
                          ("ON", True), ("no", False)])
def test_the_env_switch(monkeypatch: pytest.MonkeyPatch, value: str | None,
                        disabled: bool) -> None:
    from cadence.envs import read_envs

    if value is None:
        monkeypatch.delenv("CADENCE_DISABLE_CUSTOM_ALL_REDUCE", raising=False)
    else:
        monkeypatch.setenv("CADENCE_DISABLE_CUSTOM_ALL_REDUCE", value)
    assert read_envs().disable_custom_all_reduce is disabled


class _FakeCustom:
    def __init__(self, use: bool) -> None:
        self.use = use
        self.reduced: list[torch.Tensor] = []
        self.closed = False

    def should_use(self, x: torch.Tensor) -> bool:
        return self.use

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self.reduced.append(x)
        return x.mul_(2)

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("use", [True, False])
def test_all_reduce_dispatches_by_the_custom_kernels_answer(monkeypatch: pytest.MonkeyPatch,
                                                           use: bool) -> None:
    nccl: list[torch.Tensor] = []
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda x: nccl.append(x))
    fake = _FakeCustom(use)
    monkeypatch.setattr(parallel, "_custom", fake)
    x = torch.ones(4)
    assert parallel.all_reduce(x) is x
    assert (len(fake.reduced), len(nccl)) == ((1, 0) if use else (0, 1))
    parallel.close_custom_all_reduce()
    assert fake.closed and parallel._custom is None
    parallel.all_reduce(x)  # closed: NCCL again
    assert len(nccl) == (1 if use else 2)


def test_no_custom_all_reduce_on_the_cpu_or_when_disabled(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    created: list[Any] = []
    monkeypatch.setattr(car.CustomAllReduce, "create", classmethod(lambda cls, *a, **k:
                                                                   created.append(a)))
    with caplog.at_level(logging.INFO, logger="cadence.model.parallel"):
        assert parallel.setup_custom_all_reduce(torch.device("cpu")) is None
        monkeypatch.setenv("CADENCE_DISABLE_CUSTOM_ALL_REDUCE", "1")
        assert parallel.setup_custom_all_reduce(torch.device("cuda", 0)) is None
    assert created == [] and parallel._custom is None
    assert "not on CUDA" in caplog.text and "CADENCE_DISABLE_CUSTOM_ALL_REDUCE" in caplog.text


def test_a_failure_on_any_rank_leaves_every_rank_on_nccl(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The set-up's handshake over gloo (one rank here): a rank that cannot compile reports it,
    and every rank gets None."""
    import torch.distributed as dist

    def no_compiler(self: car.CustomAllReduce) -> None:
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(car.CustomAllReduce, "_compile", no_compiler)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        with caplog.at_level(logging.INFO, logger="cadence.model.custom_all_reduce"):
            assert car.CustomAllReduce.create(0) is None
    finally:
        dist.destroy_process_group()
    assert "rank 0: RuntimeError: no compiler here" in caplog.text


class _Runtime:
    """The cudart calls of ipc.py, recording what they were given."""

    cudaIpcMemLazyEnablePeerAccess = 1  # noqa: N815 (cuda-python's names)

    def __init__(self) -> None:
        from cuda.bindings import runtime

        self.cudaIpcMemHandle_t = runtime.cudaIpcMemHandle_t  # noqa: N815
        self.opened: list[bytes] = []

    def cudaIpcGetMemHandle(self, ptr: int) -> tuple[int, Any]:  # noqa: N802
        h = self.cudaIpcMemHandle_t()
        ctypes.memmove(h.getPtr(), bytes((ptr + i) % 256 for i in range(64)), 64)
        return 0, h

    def cudaIpcOpenMemHandle(self, h: Any, flags: int) -> tuple[int, int]:  # noqa: N802
        self.opened.append(ctypes.string_at(h.getPtr(), 64))
        return 0, 0xBEEF00


def test_ipc_handles_travel_as_64_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cuda.bindings.runtime")
    rt = _Runtime()
    monkeypatch.setattr(ipc, "cudart", lambda: rt)
    monkeypatch.setattr(ipc, "on_device", lambda index: nullcontext())
    handle = ipc.ipc_handle(7, 0)
    assert handle == bytes((7 + i) % 256 for i in range(64))
    assert ipc.open_ipc_handle(handle, 1) == 0xBEEF00 and rt.opened == [handle]
    with pytest.raises(ValueError, match="64 bytes"):
        ipc.open_ipc_handle(handle[:10], 1)


def _nvrtc_available() -> bool:
    try:
        from cuda.bindings import nvrtc

        return not int(nvrtc.nvrtcVersion()[0])
    except Exception:  # noqa: BLE001 - no cuda-python, or no libnvrtc
        return False


@pytest.mark.skipif(not _nvrtc_available(), reason="needs NVRTC")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_kernel_compiles_for_every_number_of_ranks(arch: str) -> None:
    from cadence.model.custom_all_reduce_kernel import KERNELS, SOURCE
    from cadence.runtime.module import compile_cuda

    for world in range(2, MAX_RANKS + 1):
        cubin = compile_cuda(SOURCE, "custom_all_reduce.cu", arch, [f"-DCAR_WORLD={world}"])
        assert all(name.encode() in cubin for name in KERNELS.values())
