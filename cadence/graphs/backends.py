"""How a decode step becomes a replayable graph: CUDA graphs, or an eager stand-in.

``CudaGraphBackend`` captures through ``torch.cuda.CUDAGraph`` on the runtime's main stream (torch
owns the memory pool during capture) into one pool shared by every graph, and replays with
``cudaGraphLaunch`` of the instantiated exec handle on that stream. ``EagerGraphBackend`` runs the
step again on replay: the CPU backend and ``enforce_eager`` use it so callers need one code path.

Hazard: a raw ``cudaGraphLaunch`` skips ``CUDAGraph.replay``'s bookkeeping, notably the advance
of torch's RNG offsets, so a captured step must not draw from torch's generators.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cadence.runtime.interfaces import StreamLike

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
    def __init__(self, graph: Any, size: int, output: Any, stream: StreamLike) -> None:
        from cadence.runtime.graph_launch import launch_graph

        self._graph = graph
        self._launch = launch_graph
        self._stream = stream
        self.size = size
        self.output = output
        self.exec_handle = graph.raw_cuda_graph_exec()
        self.graph_handle = graph.raw_cuda_graph()

    def replay(self) -> None:
        self._launch(self.exec_handle, self._stream)

    def node_counts(self) -> dict[str, int]:
        from cadence.runtime.graph_launch import graph_node_counts

        return graph_node_counts(self.graph_handle)

    def dump_dot(self, path: str | Path) -> Path:
        from cadence.runtime.graph_launch import dump_graph_dot

        return dump_graph_dot(self.graph_handle, path)

    def close(self) -> None:
        if self._graph is not None:
            self._graph.reset()
            self._graph = None
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
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with self.stream.context():
            graph.capture_begin(pool=self.pool, capture_error_mode=self.capture_error_mode)
            try:
                output = step(size)
            except BaseException:
                try:
                    graph.capture_end()
                finally:
                    graph.reset()
                raise
            graph.capture_end()
        graph.instantiate()
        return CudaGraphStep(graph, size, output, self.stream)

    def close(self) -> None:
        self.pool = None
