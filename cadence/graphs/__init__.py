"""CUDA graphs per bucket: decode steps by batch size, mixed steps by token count (capture
sizes, capture/replay, inspection); launch tapes for the eager steps no graph runs
(``graphs.tapes``)."""

from __future__ import annotations

from cadence.graphs.backends import CudaGraphBackend, EagerGraphBackend
from cadence.graphs.runner import CaptureReport, DecodeGraphRunner, GraphRunner
from cadence.graphs.sizes import capture_sizes, padded_batch_size, token_capture_sizes

__all__ = [
    "CaptureReport",
    "CudaGraphBackend",
    "DecodeGraphRunner",
    "EagerGraphBackend",
    "GraphRunner",
    "capture_sizes",
    "padded_batch_size",
    "token_capture_sizes",
]
