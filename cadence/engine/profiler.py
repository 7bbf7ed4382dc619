"""vLLM's ``start_profile`` / ``stop_profile``: the torch profiler around everything an engine
core runs between the two calls, each stop writing one gzipped Chrome trace (TensorBoard's and
Perfetto's format) into the directory ``CADENCE_TORCH_PROFILER_DIR`` names (or vLLM's
``VLLM_TORCH_PROFILER_DIR``), read when the engine starts. Without it profiling is off."""

from __future__ import annotations

import os
import re
import socket
from typing import Any

import torch

OFF = ("Profiling is not enabled: set CADENCE_TORCH_PROFILER_DIR (or VLLM_TORCH_PROFILER_DIR) "
       "to a directory for the traces before the engine starts.")


class TorchProfiler:
    """One profiling window at a time; started and stopped on the engine core's thread."""

    def __init__(self, directory: str, cuda: bool) -> None:
        self.directory = os.path.abspath(os.path.expanduser(directory)) if directory else ""
        self.cuda = cuda
        self._active: Any = None
        self._prefix = ""
        self._count = 0

    @property
    def enabled(self) -> bool:
        return bool(self.directory)

    @property
    def running(self) -> bool:
        return self._active is not None

    def start(self, prefix: str | None = None) -> None:
        """Start recording; ``prefix`` starts the trace's file name (vLLM's ``profile_prefix``)."""
        if not self.enabled:
            raise RuntimeError(OFF)
        if self._active is not None:
            raise RuntimeError("The profiler is already running; stop_profile() first.")
        if prefix is not None and not isinstance(prefix, str):
            raise ValueError(f"profile_prefix must be a string, got {type(prefix).__name__}.")
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
        active = profile(activities=activities, record_shapes=True)
        active.start()
        self._active = active
        # Only a file name's safe characters.
        self._prefix = re.sub(r"[^A-Za-z0-9._-]", "_", prefix or "")[:64]

    def stop(self) -> str:
        """Stop recording and write the trace; its path."""
        if self._active is None:
            raise RuntimeError("The profiler is not running; start_profile() first.")
        active, self._active = self._active, None
        if self.cuda:
            torch.cuda.synchronize()  # NOTE: deliberate: the window's kernels finish in it
        active.stop()
        os.makedirs(self.directory, exist_ok=True)
        self._count += 1
        name = f"{self._prefix}{socket.gethostname()}_{os.getpid()}_{self._count}.pt.trace.json.gz"
        path = os.path.join(self.directory, name)
        active.export_chrome_trace(path)
        return path

    def close(self) -> None:
        """Drop a window still open (its trace is not written)."""
        active, self._active = self._active, None
        if active is not None:
            active.stop()
