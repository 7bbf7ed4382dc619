"""How a decode step becomes a replayable graph: CUDA graphs, or an eager stand-in.

``CudaGraphBackend`` captures with ``stream.capture`` (``torch.cuda.CUDAGraph`` underneath: torch
owns the memory pool during capture) into one pool shared by every graph, and replays the
runtime ``Graph`` (``cudaGraphLaunch``) on that stream. ``EagerGraphBackend`` runs the
step again on replay: the runner uses it on the CPU backend (``graphs.emulate``), so callers
need one code path.

Hazard: a raw ``cudaGraphLaunch`` skips ``CUDAGraph.replay``'s bookkeeping, notably the advance
of torch's RNG offsets, so a captured step must not draw from torch's generators.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cadence.runtime.interfaces import GraphLike, StreamLike

Step = Callable[[int], Any]


class CapturedStep(Protocol):
    size: int
    output: Any  # what the step returned while being captured

    def replay(self) -> None: ...
    def node_counts(self) -> dict[str, int]: ...
    def dump_dot(self, path: str | Path) -> Path: ...
    def close(self) -> None: ...


class GraphBackend(Protocol):
    stream: StreamLike

    def capture(self, step: Step, size: int) -> CapturedStep: ...
    def close(self) -> None: ...


class EagerStep:
    def __init__(self, step: Step, size: int) -> None:
        self._step = step
        self.size = size
        self.output = step(size)

    def replay(self) -> None:
        self.output = self._step(self.size)

    def node_counts(self) -> dict[str, int]:
        return {}

    def dump_dot(self, path: str | Path) -> Path:
        raise RuntimeError("an eager step has no graph to dump")

    def close(self) -> None:
        return None


class EagerGraphBackend:
    def __init__(self, stream: StreamLike) -> None:
        self.stream = stream

    def capture(self, step: Step, size: int) -> EagerStep:
        with self.stream.context():
            return EagerStep(step, size)

    def close(self) -> None:
        return None


class CudaGraphStep:
    def __init__(self, graph: GraphLike, size: int, output: Any, stream: StreamLike) -> None:
        self.graph = graph
        self._stream = stream
        self.size = size
        self.output = output

    def replay(self) -> None:
        self.graph.launch(self._stream)

    def node_counts(self) -> dict[str, int]:
        return self.graph.node_counts()

    def dump_dot(self, path: str | Path) -> Path:
        return self.graph.to_dot(path)

    def close(self) -> None:
        self.graph.close()
        self.output = None


class CudaGraphBackend:
    """Captures on ``stream`` into one shared memory pool, largest graph first by convention."""

    def __init__(self, stream: StreamLike, capture_error_mode: str = "thread_local") -> None:
        import torch

        self.stream = stream
        self.capture_error_mode = capture_error_mode
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, step: Step, size: int) -> CudaGraphStep:
        import torch

        torch.cuda.synchronize()
        with self.stream.capture(pool=self.pool, mode=self.capture_error_mode) as graph:
            output = step(size)
        return CudaGraphStep(graph, size, output, self.stream)

    def close(self) -> None:
        self.pool = None
