"""Decode CUDA graphs per batch-size bucket (capture sizes, capture/replay, inspection)."""

from __future__ import annotations

from cadence.graphs.backends import CudaGraphBackend, EagerGraphBackend
from cadence.graphs.runner import CaptureReport, DecodeGraphRunner
from cadence.graphs.sizes import capture_sizes, padded_batch_size

__all__ = [
    "CaptureReport",
    "CudaGraphBackend",
    "DecodeGraphRunner",
    "EagerGraphBackend",
    "capture_sizes",
    "padded_batch_size",
]
