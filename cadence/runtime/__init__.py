"""Low-level GPU runtime on ``cuda.bindings``, plus a CPU backend with the same contract.

Nothing here imports cuda-python until a CUDA object is created, nor torch until a torch view
or a torch capture is asked for, so a CPU-only install works. See ``docs/runtime.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cadence.runtime.cpu import CpuBuffer, CpuDevice, CpuEvent, CpuGraph, CpuStream
from cadence.runtime.errors import CudaError, NoCudaDeviceError, check
from cadence.runtime.interfaces import DeviceProperties
from cadence.runtime.kernel_params import LaunchUnsupported
from cadence.runtime.slot_pool import Slot, SlotPool, SlotPoolExhausted

if TYPE_CHECKING:
    from cadence.runtime.buffers import DeviceBuffer, PinnedBuffer
    from cadence.runtime.device import Device
    from cadence.runtime.event import Event
    from cadence.runtime.graph import Graph
    from cadence.runtime.launcher import (
        BoundKernel,
        SimulatedKernel,
        bind,
        bind_function,
        bind_numba,
        bind_triton,
    )
    from cadence.runtime.module import Module
    from cadence.runtime.stream import Stream

__all__ = [
    "BoundKernel",
    "CpuBuffer",
    "CpuDevice",
    "CpuEvent",
    "CpuGraph",
    "CpuStream",
    "CudaError",
    "Device",
    "DeviceBuffer",
    "DeviceProperties",
    "Event",
    "Graph",
    "LaunchUnsupported",
    "Module",
    "NoCudaDeviceError",
    "PinnedBuffer",
    "SimulatedKernel",
    "Slot",
    "SlotPool",
    "SlotPoolExhausted",
    "Stream",
    "bind",
    "bind_function",
    "bind_numba",
    "bind_triton",
    "check",
    "dump_graph_dot",
    "get_device",
    "graph_kernel_count",
    "graph_node_counts",
    "launch_graph",
]

_LAZY = {
    "Device": "cadence.runtime.device",
    "get_device": "cadence.runtime.device",
    "Stream": "cadence.runtime.stream",
    "Event": "cadence.runtime.event",
    "PinnedBuffer": "cadence.runtime.buffers",
    "DeviceBuffer": "cadence.runtime.buffers",
    "Graph": "cadence.runtime.graph",
    "Module": "cadence.runtime.module",
    "BoundKernel": "cadence.runtime.launcher",
    "SimulatedKernel": "cadence.runtime.launcher",
    "bind": "cadence.runtime.launcher",
    "bind_function": "cadence.runtime.launcher",
    "bind_numba": "cadence.runtime.launcher",
    "bind_triton": "cadence.runtime.launcher",
    "launch_graph": "cadence.runtime.graph_launch",
    "graph_node_counts": "cadence.runtime.graph_launch",
    "graph_kernel_count": "cadence.runtime.graph_launch",
    "dump_graph_dot": "cadence.runtime.graph_launch",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cadence.runtime' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
