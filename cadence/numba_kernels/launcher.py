"""Launchers for the combine and scatter kernels over a runner's persistent buffers.

``NumbaTokenKernels`` binds both kernels to the torch tensors once, at construction, through the
runtime's kernel launcher (``cadence.runtime.launcher``): a launch is one ``cuLaunchKernel`` on
a runtime stream. ``HostTokenKernels`` runs the numpy references with the same interface (the
CPU backend). Both read the row counts from the 1-element int32 tensors in
``TokenBuffers`` at launch time, so the runner writes the counts into those tensors (as part of
its input upload) and a captured graph replays with whatever counts they hold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from cadence.numba_kernels.reference import combine_reference, scatter_reference

if TYPE_CHECKING:
    from cadence.runtime.interfaces import StreamLike


@dataclass
class TokenBuffers:
    """The runner's persistent tensors the kernels read and write (all on one device).

    Row ``b`` of ``req_indices`` / ``last_token_index`` / ``use_sampled`` / ``sampled`` is the
    ``b``-th request of the step; ``req_indices[b]`` is its row in ``last_sampled``.
    """

    input_ids: torch.Tensor  # [max_num_tokens] int64
    last_sampled: torch.Tensor  # [max_num_reqs] int64, GPU-resident last sampled token per request
    req_indices: torch.Tensor  # [max_rows] int32
    last_token_index: torch.Tensor  # [max_rows] int32, flat token index of the row's last token
    use_sampled: torch.Tensor  # [max_rows] int8 or int32, 1 for decode rows, 0 for prefill rows
    num_reqs: torch.Tensor  # [1] int32, rows of this step (combine)
    sampled: torch.Tensor  # [max_rows] int64, the sampler's output per row
    num_sampled: torch.Tensor | None = None  # [1] int32 rows to scatter; None: use num_reqs

    def __post_init__(self) -> None:
        rows = self.req_indices.shape[0]
        for name in ("last_token_index", "use_sampled", "sampled"):
            if getattr(self, name).shape[0] != rows:
                raise ValueError(f"{name} must have {rows} rows like req_indices")
        expected = {
            "input_ids": torch.int64,
            "last_sampled": torch.int64,
            "sampled": torch.int64,
            "req_indices": torch.int32,
            "last_token_index": torch.int32,
            "num_reqs": torch.int32,
        }
        for name, dtype in expected.items():
            if getattr(self, name).dtype != dtype:
                raise TypeError(f"{name} must be {dtype}, got {getattr(self, name).dtype}")
        if self.use_sampled.dtype not in (torch.int8, torch.int32):
            raise TypeError(f"use_sampled must be int8 or int32, got {self.use_sampled.dtype}")
        for name in ("num_reqs", "num_sampled"):
            t = getattr(self, name)
            if t is not None and (t.numel() != 1 or t.dtype != torch.int32):
                raise ValueError(f"{name} must be a 1-element int32 tensor")
        for name, t in vars(self).items():
            if t is not None and not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous")

    @property
    def rows(self) -> int:
        return self.req_indices.shape[0]

    @property
    def scatter_count(self) -> torch.Tensor:
        return self.num_reqs if self.num_sampled is None else self.num_sampled


def _kernel_args(
    buffers: TokenBuffers, convert: Callable[[torch.Tensor], Any]
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The combine and scatter arguments in kernel order, each buffer converted once."""
    names = (
        "input_ids",
        "last_sampled",
        "req_indices",
        "last_token_index",
        "use_sampled",
        "sampled",
        "num_reqs",
    )
    a = {name: convert(getattr(buffers, name)) for name in names}
    combine = (
        a["input_ids"],
        a["last_sampled"],
        a["req_indices"],
        a["last_token_index"],
        a["use_sampled"],
        a["num_reqs"],
    )
    scatter = (a["sampled"], a["req_indices"], a["last_sampled"], convert(buffers.scatter_count))
    return combine, scatter


class HostTokenKernels:
    """The kernels as numpy loops over CPU tensors (synchronous; the stream is ignored)."""

    def __init__(self, buffers: TokenBuffers) -> None:
        self.buffers = buffers
        self._combine_args, self._scatter_args = _kernel_args(buffers, torch.Tensor.numpy)

    def combine(self, stream: StreamLike | None = None) -> None:
        combine_reference(*self._combine_args)

    def scatter(self, stream: StreamLike | None = None) -> None:
        scatter_reference(*self._scatter_args)


def _view(t: torch.Tensor, simulator: bool) -> Any:
    if simulator:
        if t.is_cuda:
            raise ValueError("the Numba simulator runs on host tensors")
        return t.numpy()
    if not t.is_cuda:
        raise ValueError("NumbaTokenKernels needs CUDA tensors (use HostTokenKernels on CPU)")
    from numba import cuda

    return cuda.as_cuda_array(t)  # typed and packed once, when the kernel is bound


class NumbaTokenKernels:
    """combine/scatter as Numba CUDA kernels bound once to ``buffers`` (runtime launcher).

    Each launch covers all ``buffers.rows`` rows with a fixed grid; the counts are read on the
    device. A launch is one ``cuLaunchKernel`` on the given stream, so it may be captured into
    a CUDA graph, and the captured kernels see later counts and contents of the buffers.
    """

    def __init__(self, buffers: TokenBuffers, threads_per_block: int | None = None) -> None:
        import numba

        from cadence.numba_kernels import kernels
        from cadence.runtime.launcher import bind_numba

        self.buffers = buffers
        self.simulator = bool(numba.config.ENABLE_CUDASIM)
        combine_args, scatter_args = _kernel_args(buffers, lambda t: _view(t, self.simulator))
        self.threads = threads_per_block or kernels.THREADS_PER_BLOCK
        self.blocks = max(1, -(-buffers.rows // self.threads))
        self._combine = bind_numba(kernels.combine_kernel, self.blocks, self.threads, combine_args)
        self._scatter = bind_numba(kernels.scatter_kernel, self.blocks, self.threads, scatter_args)

    @property
    def direct_launch(self) -> bool:
        """True when both kernels launch through ``cuLaunchKernel`` (not the simulator)."""
        from cadence.runtime.launcher import BoundKernel

        return isinstance(self._combine, BoundKernel) and isinstance(self._scatter, BoundKernel)

    def combine(self, stream: StreamLike | None = None) -> None:
        """Decode rows take their input id from ``last_sampled`` (async on ``stream``)."""
        self._combine.launch(stream)

    def scatter(self, stream: StreamLike | None = None) -> None:
        """Write ``sampled`` into ``last_sampled`` by request index (async on ``stream``)."""
        self._scatter.launch(stream)


def make_token_kernels(buffers: TokenBuffers) -> NumbaTokenKernels | HostTokenKernels:
    """Numba kernels for CUDA tensors, the numpy references for CPU tensors."""
    if buffers.input_ids.is_cuda:
        check_numba_cuda()
        return NumbaTokenKernels(buffers)
    return HostTokenKernels(buffers)


def check_numba_cuda(importer: Callable[[], Any] | None = None) -> None:
    """Import numba's CUDA target, turning a numpy it does not support into a clear error.

    numba-cuda 0.30 registers ``np.row_stack``, which numpy 2.5 removed: with that pair every
    kernel import fails with a bare AttributeError deep inside numba."""
    def default() -> Any:
        from numba import cuda  # noqa: F401

        from cadence.numba_kernels import kernels  # noqa: F401

    try:
        (importer or default)()
    except AttributeError as exc:
        if "numpy" not in str(exc):
            raise
        import numpy

        raise RuntimeError(
            f"numba-cuda {_version('numba-cuda')} does not work with numpy {numpy.__version__} "
            f"({exc}); install a numpy it supports, e.g. pip install 'numpy<2.5'."
        ) from exc


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "(version unknown)"
