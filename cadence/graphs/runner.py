"""Graphs per bucket (decode batch sizes, mixed-step token counts): warm up, capture largest
first, replay by bucket."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadence.graphs.backends import CapturedStep, GraphBackend, Step
from cadence.graphs.sizes import padded_batch_size


@dataclass
class CaptureReport:
    sizes: list[int]
    seconds: float
    kernels: dict[int, int] = field(default_factory=dict)  # per size (empty when eager)


class GraphRunner:
    """Owns one captured step per size.

    ``step(num_rows)`` must read only static input buffers and write static outputs (or return
    tensors allocated during capture: those live in the shared pool, so the outputs of different
    sizes alias each other and must be consumed before the next replay). Before ``replay(size)``
    the caller fills rows ``[n, size)`` of its static inputs with padding (sequence length 0,
    the reserved dummy KV slot); ``bucket_for(n)`` gives that ``size``.
    """

    def __init__(
        self,
        step: Step,
        sizes: Sequence[int],
        backend: GraphBackend,
        warmup_iters: int = 1,
    ) -> None:
        if not sizes:
            raise ValueError("at least one capture size is needed")
        if list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
            raise ValueError(f"sizes must be positive, ascending and distinct, got {list(sizes)}")
        self.step = step
        self.sizes = list(sizes)
        self.backend = backend
        self.warmup_iters = warmup_iters
        self._graphs: dict[int, CapturedStep] = {}
        self.num_replays = 0  # over all sizes since capture

    @property
    def captured(self) -> bool:
        return len(self._graphs) == len(self.sizes)

    @property
    def max_size(self) -> int:
        return self.sizes[-1]

    def capture(self, count_kernels: bool = True) -> CaptureReport:
        """Warm up and capture every size, largest first (later graphs reuse the pool's blocks)."""
        start = time.perf_counter()
        stream = self.backend.stream
        for size in reversed(self.sizes):
            with stream.context():
                for _ in range(self.warmup_iters):
                    self.step(size)
            self._graphs[size] = self.backend.capture(self.step, size)
        stream.synchronize()
        report = CaptureReport(list(self.sizes), time.perf_counter() - start)
        if count_kernels:
            report.kernels = {s: self.kernel_count(s) for s in self.sizes}
        return report

    def bucket_for(self, n: int) -> int | None:
        """The captured size that ``n`` rows pad up to; None means: run eagerly."""
        return padded_batch_size(n, self.sizes)

    def replay(self, size: int) -> Any:
        """Launch the graph of ``size`` on the main stream; returns its captured output."""
        graph = self._graphs.get(size)
        if graph is None:
            raise KeyError(f"no graph captured for size {size} (sizes: {self.sizes})")
        graph.replay()
        self.num_replays += 1
        return graph.output

    def node_counts(self, size: int) -> dict[str, int]:
        return self._graphs[size].node_counts()

    def kernel_count(self, size: int) -> int:
        return self.node_counts(size).get("kernel", 0)

    def dump_dot(self, size: int, path: str | Path) -> Path:
        """Graphviz DOT of the graph of ``size`` (``cudaGraphDebugDotPrint``)."""
        return self._graphs[size].dump_dot(path)

    def close(self) -> None:
        for graph in self._graphs.values():
            graph.close()
        self._graphs.clear()
        self.backend.close()

    def __enter__(self) -> GraphRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The decode graphs were the first user; the name stays for existing callers.
DecodeGraphRunner = GraphRunner
