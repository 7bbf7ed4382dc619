from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from cadence.graphs import (
    CudaGraphBackend,
    DecodeGraphRunner,
    EagerGraphBackend,
    GraphRunner,
    capture_sizes,
)
from cadence.graphs.backends import CudaGraphStep
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


class LoggedStream:
    """A stream that logs its synchronizations and knows whether work runs inside it."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.depth = 0

    @contextmanager
    def context(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def synchronize(self) -> None:
        self.log.append("sync")


class LoggedGraph:
    """A captured graph that logs its launches, node counts, dumps and close."""

    def __init__(self, size: int, log: list) -> None:
        self.size, self.log = size, log

    def launch(self, stream: Any) -> None:
        self.log.append(("launch", self.size, stream))

    def node_counts(self) -> dict[str, int]:
        self.log.append(("counted", self.size))
        return {"kernel": 10 * self.size, "memcpy": 2, "memset": 1}

    def to_dot(self, path: str | Path, verbose: bool = True) -> Path:
        self.log.append(("dot", self.size))
        return Path(path)

    def close(self) -> None:
        self.log.append(("close", self.size))


class LoggedBackend:
    """CudaGraphBackend's steps over logged graphs, without a GPU."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.stream = LoggedStream(log)
        self.steps: list[CudaGraphStep] = []

    def capture(self, step: Any, size: int) -> CudaGraphStep:
        self.steps.append(CudaGraphStep(LoggedGraph(size, self.log), size, step(size),
                                        self.stream))  # type: ignore[arg-type]
        return self.steps[-1]

    def close(self) -> None:
        self.log.append("backend closed")


def test_warm_ups_and_captures_run_on_the_backend_stream() -> None:
    log: list = []
    stream = LoggedStream(log)

    def step(n: int) -> int:
        log.append((n, stream.depth > 0))
        return n

    runner = GraphRunner(step, [1, 3], EagerGraphBackend(stream), 2)  # type: ignore[arg-type]
    runner.capture()
    # Largest first, two warm-ups and the capture each, all on the stream; then one sync.
    assert log == [(3, True)] * 3 + [(1, True)] * 3 + ["sync"]


def test_eager_replay_returns_what_that_replay_computed() -> None:
    x = torch.zeros(4)
    runner = GraphRunner(lambda n: x[:n] * 2 + 1, [2, 4],  # a new tensor per call
                         EagerGraphBackend(CpuDevice().create_stream()))
    runner.capture()
    assert runner.num_replays == 0
    for value in (1.0, 5.0):
        x.fill_(value)
        assert runner.replay(4).tolist() == [2 * value + 1] * 4
        assert runner.replay(2).tolist() == [2 * value + 1] * 2
    assert runner.num_replays == 4


def test_graph_steps_launch_count_and_close_through_their_graphs(tmp_path: Path) -> None:
    log: list = []
    backend = LoggedBackend(log)
    with GraphRunner(lambda n: f"out{n}", [1, 2, 8], backend, 0) as runner:
        report = runner.capture()
        assert runner.captured and runner.max_size == 8
        assert report.kernels == {1: 10, 2: 20, 8: 80}  # kernel nodes only
        log.clear()
        assert runner.replay(2) == "out2" and runner.replay(8) == "out8"
        assert log == [("launch", 2, backend.stream), ("launch", 8, backend.stream)]
        assert runner.num_replays == 2
        assert runner.dump_dot(2, tmp_path / "g.dot") == tmp_path / "g.dot"
        assert runner.node_counts(1) == {"kernel": 10, "memcpy": 2, "memset": 1}
        log.clear()
    # Leaving the block closes every graph, then the backend; the steps drop their outputs.
    assert sorted(log[:3]) == [("close", 1), ("close", 2), ("close", 8)]
    assert log[3:] == ["backend closed"]
    assert not runner.captured
    assert [s.output for s in backend.steps] == [None] * 3


def test_capture_without_counting_asks_no_graph() -> None:
    log: list = []
    runner = GraphRunner(lambda n: n, [1, 4], LoggedBackend(log), 0)
    assert runner.capture(count_kernels=False).kernels == {}
    assert not [e for e in log if e[0] == "counted"]


def test_a_failed_capture_leaves_the_runner_uncaptured() -> None:
    def step(n: int) -> int:
        if n == 1:
            raise RuntimeError("capture failed")
        return n

    runner = GraphRunner(step, [1, 4], LoggedBackend([]), 0)
    with pytest.raises(RuntimeError, match="capture failed"):
        runner.capture()  # size 4 was captured first
    assert not runner.captured


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
