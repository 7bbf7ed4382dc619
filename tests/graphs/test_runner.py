from __future__ import annotations

from typing import Any

import pytest
import torch

from cadence.graphs import (
    CudaGraphBackend,
    DecodeGraphRunner,
    EagerGraphBackend,
    capture_sizes,
)
from cadence.runtime import CpuDevice


class Model:
    """A toy step over static buffers: out[:n] = tanh(x[:n] @ w) + row index."""

    def __init__(self, rows: int, device: str = "cpu") -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(rows, 32, generator=g).to(device)
        self.w = torch.randn(32, 32, generator=g).to(device)
        self.out = torch.zeros(rows, 32, device=device)
        self.calls: list[int] = []

    def step(self, n: int) -> torch.Tensor:
        self.calls.append(n)
        rows = torch.arange(n, device=self.x.device, dtype=torch.float32)[:, None]
        self.out[:n] = torch.tanh(self.x[:n] @ self.w) + rows
        return self.out[:n]

    def eager(self, n: int) -> torch.Tensor:
        return torch.tanh(self.x[:n] @ self.w) + torch.arange(n, device=self.x.device)[:, None]


def test_capture_warms_up_and_captures_largest_first() -> None:
    model = Model(20)
    runner = DecodeGraphRunner(
        model.step, capture_sizes(20), EagerGraphBackend(CpuDevice().create_stream()), 2
    )
    report = runner.capture()
    assert runner.captured and report.sizes == [1, 2, 4, 8, 16, 20]
    # Per size: two warm-up calls, then the capture, from the largest size down.
    assert model.calls == [s for s in [20, 16, 8, 4, 2, 1] for _ in range(3)]
    assert report.kernels == {s: 0 for s in report.sizes}


def test_replay_runs_the_bucket_and_padding_rows_are_computed_too() -> None:
    model = Model(20)
    runner = DecodeGraphRunner(
        model.step, [1, 2, 4, 8, 16, 20], EagerGraphBackend(CpuDevice().create_stream())
    )
    runner.capture()
    model.calls.clear()
    for n, bucket in [(1, 1), (3, 4), (5, 8), (9, 16), (17, 20)]:
        assert runner.bucket_for(n) == bucket
        model.x[n:bucket] = 0.0  # the caller's padding rows
        out = runner.replay(bucket)
        assert out.shape[0] == bucket
        torch.testing.assert_close(out[:n], model.eager(n))
    assert model.calls == [1, 4, 8, 16, 20]
    assert runner.bucket_for(21) is None and runner.bucket_for(0) is None
    with pytest.raises(KeyError):
        runner.replay(3)
    runner.close()
    assert not runner.captured


def test_sizes_must_be_ascending_and_distinct() -> None:
    backend = EagerGraphBackend(CpuDevice().create_stream())
    for bad in ([], [2, 1], [1, 1, 2], [0, 1]):
        with pytest.raises(ValueError):
            DecodeGraphRunner(lambda n: None, bad, backend)


@pytest.mark.gpu
def test_cuda_graphs_equal_eager_and_can_be_inspected(tmp_path: Any) -> None:
    from cadence.runtime import get_device

    dev = get_device("cuda")
    main = dev.create_stream()
    model = Model(24, "cuda")
    torch.cuda.synchronize()
    runner = DecodeGraphRunner(model.step, capture_sizes(24), CudaGraphBackend(main))
    report = runner.capture()
    assert set(report.kernels) == {1, 2, 4, 8, 16, 24}
    assert all(k >= 2 for k in report.kernels.values()), report.kernels
    model.calls.clear()
    for n in (1, 3, 8, 13, 24):
        bucket = runner.bucket_for(n)
        assert bucket is not None
        with main.context():
            model.x.copy_(torch.randn_like(model.x))  # new static inputs for this step
            out = runner.replay(bucket)
            want = model.eager(n)
        main.synchronize()
        torch.testing.assert_close(out[:n], want)
    assert model.calls == []  # replays never called the Python step
    dot = runner.dump_dot(8, tmp_path / "g8.dot")
    assert dot.read_text().lstrip().startswith("digraph")
    runner.close()
    main.close()
