"""The custom all-reduce on two (and, where there are, four) GPUs, one process per GPU: random
shapes and dtypes against a float64 sum, many calls in a row, a misaligned view, the NCCL
fallbacks, and CUDA graphs replayed with new inputs (tests/model/custom_all_reduce_worker.py)."""

from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_custom_all_reduce_equals_the_sum_of_the_inputs(world: int) -> None:
    if _gpus() < world:
        pytest.skip(f"needs {world} CUDA devices")
    import torch.multiprocessing as mp

    from tests.model.custom_all_reduce_worker import run

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run, args=(world, port), nprocs=world, join=True, start_method="spawn")
