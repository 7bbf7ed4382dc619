"""vLLM's ``start_profile`` / ``stop_profile``: the torch profiler around everything an engine
(or a tensor-parallel rank) runs between the two calls, each stop writing one gzipped Chrome
trace (TensorBoard's and Perfetto's format) into the directory ``CADENCE_TORCH_PROFILER_DIR``
names (or vLLM's ``VLLM_TORCH_PROFILER_DIR``), read when the engine starts. Without it
profiling is off. As vLLM's, a start while running and a stop while not are no-ops."""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Iterable
from typing import Any

import torch

logger = logging.getLogger(__name__)

OFF = ("Profiling is not enabled: set CADENCE_TORCH_PROFILER_DIR (or VLLM_TORCH_PROFILER_DIR) "
       "to a directory for the traces before the engine starts.")


class TraceWriteError(OSError):
    """The trace of a finished window could not be written (the window's data is lost)."""


class TorchProfiler:
    """One profiling window at a time, started and stopped on the thread that runs the model.
    ``rank``: a tensor-parallel rank's, in its trace's file name."""

    def __init__(self, directory: str, cuda: bool, rank: int | None = None,
                 options: Iterable[tuple[str, bool]] = ()) -> None:
        self.directory = os.path.abspath(os.path.expanduser(directory)) if directory else ""
        self.cuda = cuda
        self.rank = rank
        # torch.profiler.profile's keywords: shapes by default, stacks, FLOPs, memory if asked.
        self.options = {"record_shapes": True, **dict(options)}
        self._active: Any = None
        self._prefix = ""

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
        if prefix is not None and not isinstance(prefix, str):
            raise ValueError(f"profile_prefix must be a string, got {type(prefix).__name__}.")
        if self._active is not None:
            logger.info("The profiler is already running; start_profile ignored.")
            return
        # NOTE: torch has one profiler a process: another's window (a second engine's, or the
        # caller's own torch.profiler) would be ended by this one's stop.
        if torch._C._autograd._profiler_enabled():
            raise RuntimeError("Another torch profiler is running in this process; stop it "
                               "before start_profile.")
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            raise RuntimeError(f"The trace directory {self.directory} cannot be made: "
                               f"{exc}") from None
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise RuntimeError(f"The trace directory {self.directory} is not writable.")
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
        active = profile(activities=activities, **self.options)
        active.start()
        self._active = active
        # A file name's safe characters only, never a hidden file's leading dot.
        self._prefix = re.sub(r"[^A-Za-z0-9._-]", "_", prefix or "")[:64].lstrip(".")

    def stop(self) -> str | None:
        """Stop recording and write the trace; its path (None where nothing was running)."""
        if self._active is None:
            logger.info("The profiler is not running; stop_profile ignored.")
            return None
        active, self._active = self._active, None
        if self.cuda:
            torch.cuda.synchronize()  # NOTE: deliberate: the window's kernels finish in it
        active.stop()
        rank = "" if self.rank is None else f"_rank{self.rank}"
        lead = f"{self._prefix}_" if self._prefix else ""
        name = (f"{lead}{socket.gethostname()}_{os.getpid()}{rank}.{time.time_ns()}"
                ".pt.trace.json.gz")
        path = os.path.join(self.directory, name)
        try:
            active.export_chrome_trace(path)
        except OSError as exc:
            raise TraceWriteError(f"The trace could not be written to {path}: {exc}") from None
        return path

    def close(self) -> None:
        """At shutdown: a window still open is stopped and its trace written (vLLM's)."""
        if self._active is None:
            return
        try:
            path = self.stop()
            logger.info("Profiler stopped at shutdown; trace written to %s.", path)
        except Exception as exc:  # shutdown goes on
            logger.warning("Profiler stopped at shutdown; its trace was lost: %s", exc)
