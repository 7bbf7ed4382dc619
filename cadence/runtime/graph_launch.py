"""Raw CUDA graph helpers: launch an instantiated graph, inspect and dump a captured one."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cadence.runtime._cudart import cudart
from cadence.runtime.errors import check, raise_for

if TYPE_CHECKING:
    from cadence.runtime.interfaces import StreamLike

KERNEL = "kernel"


def launch_graph(exec_handle: Any, stream: StreamLike) -> None:
    """``cudaGraphLaunch`` of a ``cudaGraphExec_t`` (an int such as
    ``torch.cuda.CUDAGraph.raw_cuda_graph_exec()`` returns, or a cuda-python handle)."""
    (err,) = cudart().cudaGraphLaunch(exec_handle, stream.handle)
    if err:
        raise_for(err, "cudaGraphLaunch")


def _node_type_name(node_type: Any) -> str:
    name = getattr(node_type, "name", str(node_type))
    prefix = "cudaGraphNodeType"
    return name[len(prefix) :].lower() if name.startswith(prefix) else name.lower()


def graph_node_counts(graph: Any) -> dict[str, int]:
    """Count a ``cudaGraph_t``'s nodes by type (``"kernel"``, ``"memcpy"``, ``"memset"``, ...).

    Child-graph nodes are counted as ``"graph"`` and not descended into.
    """
    rt = cudart()
    _, num_nodes = check(rt.cudaGraphGetNodes(graph, 0), "cudaGraphGetNodes")
    if num_nodes == 0:
        return {}
    nodes, _ = check(rt.cudaGraphGetNodes(graph, num_nodes), "cudaGraphGetNodes")
    counts: Counter[str] = Counter()
    for node in nodes[:num_nodes]:
        counts[_node_type_name(check(rt.cudaGraphNodeGetType(node), "cudaGraphNodeGetType"))] += 1
    return dict(counts)


def graph_kernel_count(graph: Any) -> int:
    """Number of kernel nodes in a ``cudaGraph_t``."""
    return graph_node_counts(graph).get(KERNEL, 0)


def dump_graph_dot(graph: Any, path: str | Path, verbose: bool = True) -> Path:
    """Write a ``cudaGraph_t`` as Graphviz DOT through ``cudaGraphDebugDotPrint``."""
    rt = cudart()
    flags = (
        rt.cudaGraphDebugDotFlags.cudaGraphDebugDotFlagsVerbose
        if verbose
        else rt.cudaGraphDebugDotFlags.cudaGraphDebugDotFlagsKernelNodeParams
    )
    out = Path(path)
    check(rt.cudaGraphDebugDotPrint(graph, str(out).encode(), int(flags)), "cudaGraphDebugDotPrint")
    return out
