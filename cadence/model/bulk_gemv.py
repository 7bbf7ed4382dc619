"""One-row projections through the bulk-copy GEMV (``bulk_gemv_kernel``): ``x @ W.T`` for a
single bfloat16 row on Hopper (``W`` in bfloat16, or in e4m3 with a float32 scale per row), the
weight streamed through shared memory by ``cp.async.bulk`` copies that start before the kernel
waits for the one before it (a programmatic dependent launch), with the decoder's (residual
add +) RMSNorm or SwiGLU applied to the input in the same launch.

``bulk_gemv(x, weight, cfg)``, ``bulk_gemv_norm(x, residual, norm_weight, eps, weight, cfg)``
and ``bulk_gemv(x, weight, cfg, glu=True)`` are the three launches; ``bulk_applies`` says where
they can run (CUDA, compute capability 9.0+, NVRTC, a bfloat16 input, one contiguous row,
16-byte aligned, K a multiple of 8, of 16 for e4m3; the norm needs K >= 512 and an aligned norm
weight). The kernel is compiled once per device,
configuration and mode (NVRTC, about a second). Launches on the current torch stream; a launch
inside ``launch_tape.recording()`` is recorded with its parameters.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass
from typing import Any

import torch

from cadence.envs import read_envs
from cadence.model.bulk_gemv_kernel import KERNEL, NORM_LANES, SOURCE, defines, shared_bytes
from cadence.model.capability import device_capability
from cadence.model.mlp_block import _sm_count
from cadence.model.skinny_gemm_kernels import _norm_fits
from cadence.runtime.launch_tape import active_recorder
from cadence.runtime.triton_launch import pdl_enabled

__all__ = ["BULK_CONFIGS", "BULK_FP8_CONFIGS", "BulkConfig", "bulk_applies", "bulk_config",
           "bulk_gemv", "bulk_gemv_norm", "bulk_listed", "MAX_SHARED"]

ENABLED = not read_envs().disable_bulk_gemv
MAX_SHARED = 227 * 1024  # Hopper's dynamic shared memory per block
_MODES = {"plain": 0, "norm": 1, "glu": 2}
# The device BULK_CONFIGS was measured on; no other takes the kernel.
TABLE_CAPABILITY = (9, 0)


@dataclass(frozen=True)
class BulkConfig:
    """``rows`` weight rows per stage, ``stages`` stages in the ring, ``threads`` per block
    (one block per SM); with e4m3 weights, ``hw_cvt``: each weight pair becomes f16 by the
    hardware conversion (one instruction) rather than by integer operations (four)."""

    rows: int
    stages: int
    threads: int = 256
    hw_cvt: bool = False

    def __post_init__(self) -> None:
        if self.threads not in (128, 256, 512):
            raise ValueError(f"threads must be 128, 256 or 512, got {self.threads}")
        if self.rows < 1 or self.rows & (self.rows - 1) or self.rows > self.threads:
            raise ValueError(f"rows must be a power of two up to threads, got {self.rows}")
        if not 1 <= self.stages <= 8:
            raise ValueError(f"stages must be 1 to 8, got {self.stages}")

    def shared_bytes(self, k: int, fp8: bool = False) -> int:
        return shared_bytes(k, self.rows, self.stages, fp8)


# (N, K, mode) -> the configuration of a one-row projection of that weight shape, in that mode
# ("plain", "norm": the input's add + RMSNorm first, "glu": SwiGLU of [gate | up] first). H200,
# scripts/bulk_gemv_bench.py --quick: us per call, calls back to back in a graph, against
# today's path (skinny GEMM / cuBLAS, with the norm as SkinnyLinear.forward_norm runs it). Every
# shape is listed even where its isolated call is slower: in a layer's chain each kernel's
# weights stream while the one before ends (PDL), which the isolated calls do not show. Chain of
# the four projections, us per layer: Llama-3-8B 121.45 -> 114.63; Qwen3-0.6B 19.97 (qkv, then
# the MLP block) -> 15.62.
BULK_CONFIGS: dict[tuple[int, int, str], BulkConfig] = {
    (1024, 2048, "plain"): BulkConfig(8, 2, 256),  # 2.18 vs 4.67 us
    (1024, 3072, "glu"): BulkConfig(8, 2, 256),  # 3.44 vs 4.97 us
    (4096, 1024, "norm"): BulkConfig(16, 2, 256),  # 3.90 vs 4.89 us
    (4096, 4096, "plain"): BulkConfig(8, 3, 256),  # 10.00 vs 11.24 us
    (4096, 14336, "glu"): BulkConfig(2, 3, 256),  # 34.95 vs 36.21 us
    (6144, 1024, "norm"): BulkConfig(16, 3, 256),  # 4.87 vs 6.82 us
    (6144, 4096, "norm"): BulkConfig(4, 4, 256),  # 16.60 vs 16.16 us
    (28672, 4096, "norm"): BulkConfig(4, 4, 256),  # 58.28 vs 58.78 us
}


# The same for e4m3 weights (Fp8Linear), keyed alike; against Fp8Linear's weight-only kernel
# (with its norm or SwiGLU kernel). H200, scripts/bulk_gemv_bench.py --weights fp8 --threads
# 256,512; every entry converts by the hardware (hw_cvt). Chain of the four, us per layer:
# Llama-3-8B 77.15 -> 67.61; a batch-1 decode step 2.940 -> 2.666 ms against the integer
# conversion's table (down is listed too: the step was measured with all four). qkv takes 256
# threads and 8-row stages (82 KB): its blocks then leave registers and shared memory for decode
# attention's early loads beside them (the step 2.619 -> 2.561 ms; at 512 threads the early
# order lost, docs/perf.md, runs SE-SF).
BULK_FP8_CONFIGS: dict[tuple[int, int, str], BulkConfig] = {
    (4096, 4096, "plain"): BulkConfig(16, 3, 512, hw_cvt=True),  # 6.49 vs 7.58 us
    (4096, 14336, "glu"): BulkConfig(4, 3, 512, hw_cvt=True),  # 20.11 vs 21.76 us
    (6144, 4096, "norm"): BulkConfig(8, 2, 256, hw_cvt=True),  # 10.01 at (16, 2, 512)
    (28672, 4096, "norm"): BulkConfig(16, 2, 512, hw_cvt=True),  # 34.29 vs 35.65 us
}
FP8 = torch.float8_e4m3fn


def _table(weight: torch.Tensor) -> dict[tuple[int, int, str], BulkConfig] | None:
    if weight.dtype == torch.bfloat16:
        return BULK_CONFIGS
    return BULK_FP8_CONFIGS if weight.dtype == FP8 else None


@functools.cache
def nvrtc_ok() -> bool:
    try:
        from cuda.bindings import nvrtc

        return not int(nvrtc.nvrtcVersion()[0])
    except Exception:  # noqa: BLE001 - no cuda-python, or no libnvrtc
        return False


def bulk_applies(x: torch.Tensor, weight: torch.Tensor, cfg: BulkConfig, mode: str = "plain",
                 residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                 scale: torch.Tensor | None = None) -> bool:
    """Whether the kernel takes this call: see the module docstring. ``x`` is the input as
    passed (``[1, K]``, or ``[1, 2K]`` for "glu"); "norm" also checks its ``residual`` (None,
    or contiguous of x's shape and dtype) and ``norm_weight`` (contiguous, x's dtype, [K],
    16-byte aligned) on x's device; an e4m3 ``weight`` needs its ``scale`` (float32, [N],
    contiguous, on its device)."""
    if not (x.is_cuda and weight.is_cuda and x.dtype == torch.bfloat16):
        return False
    fp8 = weight.dtype == FP8
    if not fp8 and weight.dtype != torch.bfloat16:
        return False
    n, k = weight.shape
    if fp8 and not (scale is not None and scale.dtype == torch.float32 and scale.is_contiguous()
                    and scale.numel() == n and scale.device == weight.device and k % 16 == 0):
        return False
    width = 2 * k if mode == "glu" else k
    if x.numel() != width or n == 0 or k % 8 or not (x.is_contiguous() and weight.is_contiguous()):
        return False
    if (x.data_ptr() | weight.data_ptr()) & 15 or cfg.shared_bytes(k, fp8) > MAX_SHARED:
        return False
    if mode == "norm":
        # skinny_matmul_norm's operand rule, plus what this kernel's loads need.
        if k < NORM_LANES or norm_weight is None or x.dim() != 2:
            return False
        if not _norm_fits(x, residual, norm_weight, k):
            return False
        if norm_weight.data_ptr() & 15 or norm_weight.device != x.device:
            return False
        if residual is not None and residual.device != x.device:
            return False
    return device_capability(x.device) >= (9, 0) and nvrtc_ok()


def bulk_listed(weight: torch.Tensor, mode: str) -> bool:
    """Whether one-row calls of this weight in ``mode`` take the kernel on its device (the
    table lists its shape; the call's own operands are checked by ``bulk_config``)."""
    table = _table(weight)
    return (ENABLED and table is not None and weight.is_cuda and weight.dim() == 2
            and (*weight.shape, mode) in table
            and device_capability(weight.device) == TABLE_CAPABILITY)


def bulk_config(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, mode: str,
                residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                scale: torch.Tensor | None = None) -> BulkConfig | None:
    """The configuration a one-row call takes, or None where it keeps its other kernels: the
    table lists the shape on this device, no bias, no autograd, and ``bulk_applies``."""
    if bias is not None or not bulk_listed(weight, mode):
        return None
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x, weight, residual, norm_weight)):
        return None
    cfg = _table(weight)[(*weight.shape, mode)]  # type: ignore[index]
    return cfg if bulk_applies(x, weight, cfg, mode, residual, norm_weight, scale) else None


class CompiledKernel:
    """A kernel of CUDA C++ ``source`` compiled by NVRTC for one device with ``options``
    (shared by the bulk kernels: ``bulk_mma`` too), its dynamic shared memory raised on
    demand."""

    def __init__(self, device: int, source: str, name: str, options: list[str]) -> None:
        from cadence.runtime.module import Module

        self.module = Module.from_source(source, f"{name}.cu", options, device_index=device)
        self.function = self.module.function(name)
        self.shared_set = 48 * 1024
        self.lock = threading.Lock()

    def allow_shared(self, nbytes: int) -> None:
        if nbytes <= self.shared_set:
            return
        from cuda.bindings import driver as drv

        from cadence.runtime.errors import check_driver

        with self.lock:
            attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check_driver(drv.cuFuncSetAttribute(self.function, attr, nbytes),
                         "cuFuncSetAttribute")
            self.shared_set = nbytes


_KERNELS: dict[tuple[int, str, tuple[str, ...]], CompiledKernel] = {}


def compiled(device: int, source: str, name: str, options: list[str]) -> CompiledKernel:
    """The kernel ``name`` of ``source`` with ``options`` on ``device``, compiled once."""
    key = (device, name, tuple(options))
    kernel = _KERNELS.get(key)
    if kernel is None:
        kernel = _KERNELS[key] = CompiledKernel(device, source, name, options)
    return kernel


def launch(kernel: CompiledKernel, blocks: int, threads: int, shared: int, device: torch.device,
           args: tuple[Any, ...]) -> None:
    """Launch on the current torch stream (a programmatic dependent launch where enabled);
    recorded with its parameters inside ``launch_tape.recording()``."""
    kernel.allow_shared(shared)
    bound = BulkLaunch(kernel, blocks, threads, shared, pdl_enabled(device), args)
    stream = torch.cuda.current_stream(device).cuda_stream
    bound.launch(stream)
    recorder = active_recorder()
    if recorder is not None:
        recorder.add(bound, stream, args)


def blocks_for(device: torch.device, n: int) -> int:
    return min(_sm_count(device), n)  # one block per SM, each with at least one row


class BulkLaunch:
    """One launch with its parameters and launch configuration bound (what a launch tape
    replays: a replay pays one driver call, not the configuration's construction)."""

    def __init__(self, kernel: CompiledKernel, blocks: int, threads: int, shared: int, pdl: bool,
                 args: tuple[Any, ...]) -> None:
        from cuda.bindings import driver as drv

        from cadence.runtime.kernel_params import PackedParams, raw_params

        self.kernel = kernel
        self.args = args  # the tensors stay alive as long as the launch
        self.params = PackedParams(raw_params(args))
        config = drv.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = blocks, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
        config.sharedMemBytes = shared
        if pdl:
            attr = drv.CUlaunchAttribute()
            attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            config.attrs = [attr]
            config.numAttrs = 1
        self.config = config
        self.stream: int | None = None
        self._drv = drv

    def launch(self, stream: int) -> None:
        from cadence.runtime.errors import check_driver

        if stream != self.stream:
            self.config.hStream = self._drv.CUstream(stream)
            self.stream = stream
        check_driver(self._drv.cuLaunchKernelEx(self.config, self.kernel.function,
                                                self.params.address, 0), "cuLaunchKernelEx")


def _run(x: torch.Tensor, weight: torch.Tensor, cfg: BulkConfig, mode: int,
         residual: torch.Tensor | None, norm_weight: torch.Tensor | None, eps: float,
         out: torch.Tensor, res_out: torch.Tensor | None, scale: torch.Tensor | None) -> None:
    n, k = weight.shape
    fp8 = weight.dtype == FP8
    options = defines(cfg.rows, cfg.stages, cfg.threads, mode, residual is not None, fp8, k,
                      cfg.hw_cvt)
    kernel = compiled(x.get_device(), SOURCE, KERNEL, options)
    args = kernel_args(x, weight, residual, norm_weight, scale, out, res_out, eps)
    launch(kernel, blocks_for(x.device, n), cfg.threads, cfg.shared_bytes(k, fp8), x.device,
           args)


def kernel_args(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
                norm_weight: torch.Tensor | None, scale: torch.Tensor | None, out: torch.Tensor,
                res_out: torch.Tensor | None, eps: float) -> tuple[Any, ...]:
    """The kernel's parameters in order (an operand a mode does not read is passed as ``x``
    or ``out``: any valid address)."""
    n, k = weight.shape
    return (weight, x, x if residual is None else residual,
            x if norm_weight is None else norm_weight, x if scale is None else scale, out,
            out if res_out is None else res_out, ctypes.c_int32(n), ctypes.c_int32(k),
            ctypes.c_float(eps))


def bulk_gemv(x: torch.Tensor, weight: torch.Tensor, cfg: BulkConfig, glu: bool = False,
              scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T`` ([1, N]) for one row ``x`` ([1, K]; with ``glu`` ``[1, 2K]``, gate then
    up, and the product is ``silu_and_mul(x) @ weight.T``); an e4m3 ``weight`` is
    ``weight * scale[:, None]``. The caller checks ``bulk_applies``."""
    n = weight.shape[0]
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _run(x, weight, cfg, _MODES["glu" if glu else "plain"], None, None, 0.0, out, None, scale)
    return out


def bulk_gemv_norm(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                   eps: float, weight: torch.Tensor, cfg: BulkConfig,
                   scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(bulk_gemv(h, weight, cfg, scale=scale), s)`` for ``h, s = add_rms_norm(x, residual,
    norm_weight, eps)`` (``rms_norm`` and ``s = x`` without a residual): one launch, ``h``
    with the RMSNorm kernel's bits. ``residual`` and ``norm_weight`` are contiguous bfloat16
    of x's and K's shape; ``bulk_applies(x, weight, cfg, "norm", ..., scale)`` holds."""
    n, k = weight.shape
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    res_out = x if residual is None else torch.empty_like(x)
    _run(x, weight, cfg, _MODES["norm"], residual, norm_weight, eps, out,
         None if residual is None else res_out, scale)
    return out, res_out
