"""A decoder layer's second half for one token in one launch (``mlp_block_triton``):
``o_proj`` -> residual add + RMSNorm -> ``gate_up_proj`` -> SwiGLU -> ``down_proj``.

At one row each of those projections is a few MB of weights that one kernel streams in ~5 us,
most of it launch, ramp-up and tail rather than bytes. One cooperative launch of a program per
SM runs the three with grid barriers between them, and each program loads its next weight tile
before it waits at a barrier.

``mlp_block(a, residual, ...)`` returns ``(out, new_residual)``: what ``o_proj``, the post-
attention ``add_rms_norm`` and the MLP give, with the unfused kernels' rounding at every step
(only each dot product's order of additions differs). ``block_applies`` says where it runs:
one row, CUDA (or Triton's interpreter, one phase per launch), no bias, one dtype, rows of the
three weights at most ``MAX_WIDTH`` wide (a tile row is held in registers).
``CADENCE_DISABLE_MLP_BLOCK=1`` keeps the three projections' own kernels. On Hopper the launch
is also a programmatic dependent one (``pdl_enabled``): its first weight tiles load while the
attention before it ends, and it lets the next layer's qkv kernel start during its last phase.

NOTE: the launches of one device share its scratch vectors and barrier counters (as the split-K
skinny launches share theirs), so two must not run at the same time on different streams.
"""

from __future__ import annotations

import logging
import os

import torch

from cadence.envs import read_envs
from cadence.model.mlp_block_triton import _mlp_block_kernel
from cadence.model.rms_norm_kernels import norm_chunk
from cadence.runtime.triton_launch import TritonLaunch, next_pow2, pdl_enabled

try:
    import triton
except ImportError:  # pragma: no cover - CPU installs
    triton = None

__all__ = ["MAX_WIDTH", "ROWS", "block_applies", "mlp_block"]

logger = logging.getLogger(__name__)

ENABLED = not read_envs().disable_mlp_block
MAX_WIDTH = 4096
ROWS = 8  # output rows per weight tile
# H200, Qwen3-0.6B shapes (scripts/mlp_block_bench.py), us a layer: 8 warps and 8-row tiles
# 15.9-16.3 against 16.9 for the three kernels; 4-row tiles 15.6-17.3, 16-row 21.7, 4 warps
# 19.5, 16 warps 25.7; two gate / up tiles in flight 16.5-16.7; every program's whole slices
# loaded up front (16 warps, register-bound) 26.2.
NUM_WARPS = 8
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Programs of a phased launch under the interpreter: few, so that programs take several tiles.
INTERPRETED_PROGRAMS = 3

if triton is not None:
    _COOPERATIVE = TritonLaunch(_mlp_block_kernel, cooperative=True)
    _PHASED = TritonLaunch(_mlp_block_kernel)

# Per (device index, dtype, hidden, intermediate): the o and act scratch vectors and the three
# barrier counters (zero between launches). Allocated by the first (eager) call: under a CUDA
# graph capture the counters would be zeroed only when the graph replays.
_SCRATCH: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
# Devices (index) where a cooperative launch failed: the unfused kernels from then on.
_REFUSED: set[int] = set()


_SMS: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    sms = _SMS.get(device.index)
    if sms is None:
        sms = _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return sms


def _programs(device: torch.device) -> int:
    """One program per SM (the interpreter: a few, so that several hold rows)."""
    return INTERPRETED_PROGRAMS if _INTERPRETED or device.type != "cuda" else _sm_count(device)


def _scratch(device: torch.device, dtype: torch.dtype, hidden: int, inter: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    key = (device.index, dtype, hidden, inter)
    found = _SCRATCH.get(key)
    if found is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        found = (torch.empty(hidden, dtype=dtype, device=device),
                 torch.empty(inter, dtype=dtype, device=device),
                 torch.zeros(3, dtype=torch.int32, device=device))
        _SCRATCH[key] = found
    return found


def block_applies(rows: int, dtype: torch.dtype, device: torch.device,
                  residual: torch.Tensor, o_weight: torch.Tensor, norm_weight: torch.Tensor,
                  gate_up_weight: torch.Tensor, down_weight: torch.Tensor) -> bool:
    """Whether ``mlp_block`` runs a step of ``rows`` rows in ``dtype`` on ``device`` with these
    operands (see the module's docstring)."""
    if not ENABLED or triton is None or rows != 1 or dtype not in _DTYPES:
        return False
    if not (device.type == "cuda" or _INTERPRETED) or device.index in _REFUSED:
        return False
    tensors = (residual, o_weight, norm_weight, gate_up_weight, down_weight)
    if any(t.dtype != dtype or t.device != device or not t.is_contiguous() for t in tensors):
        return False
    hidden, q_width = o_weight.shape
    inter2, h2 = gate_up_weight.shape
    if h2 != hidden or inter2 % 2 or residual.numel() != hidden:
        return False
    if down_weight.shape != (hidden, inter2 // 2) or norm_weight.shape != (hidden,):
        return False
    if max(q_width, hidden, inter2 // 2) > MAX_WIDTH:
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def mlp_block(a: torch.Tensor, residual: torch.Tensor, o_weight: torch.Tensor,
              norm_weight: torch.Tensor, eps: float, gate_up_weight: torch.Tensor,
              down_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(down(silu_and_mul(gate_up(h))), s)`` for ``h, s = add_rms_norm(o_proj(a), residual)``
    in one launch, for operands ``block_applies`` accepts and a contiguous ``a`` [1, q_size];
    None where the launch cannot run here (the caller then runs the unfused kernels)."""
    hidden, q_width = o_weight.shape
    inter = gate_up_weight.shape[0] // 2
    scratch = _scratch(a.device, a.dtype, hidden, inter)
    if scratch is None:
        return None
    o_buf, act_buf, counters = scratch
    out = torch.empty((1, hidden), dtype=a.dtype, device=a.device)
    res_out = torch.empty((1, hidden), dtype=a.dtype, device=a.device)
    programs = _programs(a.device)
    args = (a, o_weight, residual, norm_weight, gate_up_weight, down_weight, o_buf, act_buf,
            out, res_out, counters, eps, hidden, q_width, inter)
    constexprs = dict(ROWS=ROWS, BLOCK_Q=next_pow2(q_width, 16), BLOCK_H=next_pow2(hidden, 16),
                      BLOCK_I=next_pow2(inter, 16), NORM_CHUNK=norm_chunk(hidden))
    if _INTERPRETED or not a.is_cuda:  # the interpreter runs programs in turn: phase by phase
        for phase in (0, 1, 2):
            _PHASED((programs,), args, PHASE=phase, num_warps=NUM_WARPS, **constexprs)
        return out, res_out.view(residual.shape)
    try:
        _COOPERATIVE((programs,), args, PHASE=-1, num_warps=NUM_WARPS, num_stages=1,
                     pdl=pdl_enabled(a.device), **constexprs)
    except Exception:  # e.g. a cooperative launch this device refuses
        _REFUSED.add(a.device.index)
        if torch.cuda.is_current_stream_capturing():
            raise  # the capture is broken already: its caller captures again, unfused
        logger.warning("the one-launch MLP block failed; its three projections run as kernels "
                       "of their own from now on", exc_info=True)
        return None
    return out, res_out.view(residual.shape)
