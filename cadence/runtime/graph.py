"""CUDA graphs as objects: ``with stream.capture() as graph:`` records, ``graph.launch(stream)``
replays.

Where torch is installed the capture goes through ``torch.cuda.CUDAGraph`` (keep_graph=True), so
that tensors torch allocates inside the block come from a graph memory pool (``pool``: share one
between graphs, e.g. ``pool=earlier_graph.pool`` or ``torch.cuda.graph_pool_handle()``); without
torch it is ``cudaStreamBeginCapture`` / ``cudaStreamEndCapture`` / ``cudaGraphInstantiate``.
``mode`` is the capture mode: ``"thread_local"`` (default), ``"global"`` or ``"relaxed"``.

Hazard: ``launch`` is a raw ``cudaGraphLaunch``, which skips ``CUDAGraph.replay``'s bookkeeping,
notably the advance of torch's RNG offsets: a graph replayed this way must not draw from torch's
random generators.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cadence.runtime._cudart import cudart
from cadence.runtime.errors import check, raise_for
from cadence.runtime.graph_launch import dump_graph_dot, graph_node_counts

if TYPE_CHECKING:
    from cadence.runtime.interfaces import StreamLike

_MODES = ("thread_local", "global", "relaxed")


class Graph:
    """A captured, instantiated CUDA graph. Usable once its ``capture`` block has ended."""

    def __init__(self) -> None:
        self.handle: Any = None  # cudaGraph_t (an int from torch, a cuda-python handle otherwise)
        self.exec_handle: Any = None  # cudaGraphExec_t
        self._torch_graph: Any = None
        self._rt = cudart()
        self.closed = False

    @property
    def pool(self) -> Any:
        """The memory pool the capture allocated from (torch captures only): pass it as
        ``pool=`` to later captures so that they share it."""
        return None if self._torch_graph is None else self._torch_graph.pool()

    def _ready(self) -> None:
        if self.closed:
            raise ValueError("the graph is closed")
        if self.exec_handle is None:
            raise RuntimeError("the graph is still being captured (use it after the with block)")

    def launch(self, stream: StreamLike) -> None:
        """Replay the graph on ``stream`` (``cudaGraphLaunch``)."""
        if self.exec_handle is None:
            self._ready()
        (err,) = self._rt.cudaGraphLaunch(self.exec_handle, stream.handle)
        if err:
            raise_for(err, "cudaGraphLaunch")

    def node_counts(self) -> dict[str, int]:
        """Nodes by type: ``{"kernel": 12, "memcpy": 1, ...}``."""
        self._ready()
        return graph_node_counts(self.handle)

    @property
    def kernel_count(self) -> int:
        return self.node_counts().get("kernel", 0)

    def to_dot(self, path: str | Path, verbose: bool = True) -> Path:
        """Write the graph as Graphviz DOT (``cudaGraphDebugDotPrint``)."""
        self._ready()
        return dump_graph_dot(self.handle, path, verbose)

    def close(self) -> None:
        """Free the graph and its executable; replays already queued still complete."""
        if self.closed:
            return
        self.closed = True
        if self._torch_graph is not None:
            self._torch_graph.reset()
            self._torch_graph = None
        elif self.exec_handle is not None:
            rt = cudart()
            check(rt.cudaGraphExecDestroy(self.exec_handle), "cudaGraphExecDestroy")
            check(rt.cudaGraphDestroy(self.handle), "cudaGraphDestroy")
        self.handle = self.exec_handle = None

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "capturing" if self.exec_handle is None else "ready"
        return f"Graph({state})"


def capture(stream: StreamLike, pool: Any = None, mode: str = "thread_local") -> Any:
    """The context manager behind ``Stream.capture``; torch's capture when torch is installed."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if importlib.util.find_spec("torch") is not None:
        return _torch_capture(stream, pool, mode)
    if pool is not None:
        raise ValueError("a memory pool is a torch capture's; torch is not installed")
    return _raw_capture(stream, mode)


@contextmanager
def _torch_capture(stream: StreamLike, pool: Any, mode: str) -> Iterator[Graph]:
    import torch

    graph = Graph()
    tg = torch.cuda.CUDAGraph(keep_graph=True)  # keep the cudaGraph_t for inspection
    with stream.context():
        tg.capture_begin(pool=pool, capture_error_mode=mode)
        try:
            yield graph
        except BaseException:
            # The block's error is the one to raise: an invalidated capture's own failure to
            # end is not.
            with suppress(Exception):
                tg.capture_end()
            with suppress(Exception):
                tg.reset()
            raise
        tg.capture_end()
    tg.instantiate()
    graph._torch_graph = tg
    graph.handle = tg.raw_cuda_graph()
    graph.exec_handle = tg.raw_cuda_graph_exec()


@contextmanager
def _raw_capture(stream: StreamLike, mode: str) -> Iterator[Graph]:
    rt = cudart()
    modes = rt.cudaStreamCaptureMode
    capture_mode = {
        "thread_local": modes.cudaStreamCaptureModeThreadLocal,
        "global": modes.cudaStreamCaptureModeGlobal,
        "relaxed": modes.cudaStreamCaptureModeRelaxed,
    }[mode]
    graph = Graph()
    check(rt.cudaStreamBeginCapture(stream.handle, capture_mode), "cudaStreamBeginCapture")
    try:
        yield graph
    except BaseException:
        err, raw = rt.cudaStreamEndCapture(stream.handle)
        if not err and int(raw):
            rt.cudaGraphDestroy(raw)
        raise
    raw = check(rt.cudaStreamEndCapture(stream.handle), "cudaStreamEndCapture")
    try:
        graph.exec_handle = check(rt.cudaGraphInstantiate(raw, 0), "cudaGraphInstantiate")
    except BaseException:
        rt.cudaGraphDestroy(raw)
        raise
    graph.handle = raw
