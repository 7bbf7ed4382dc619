"""The token embedding lookup as one Triton launch on CUDA: the table's rows at the step's ids,
copied as they are (the bits of ``torch.embedding``), through a cached launch that a launch
tape can hold (``graphs/tapes.py``). An id outside the table gives a row of zeros instead of
reading past it (the input processor refuses such ids before they get here)."""

from __future__ import annotations

import torch
from torch import nn

from cadence.runtime.triton_launch import TritonLaunch, next_pow2

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs
    triton = None
    tl = None

_MAX_BLOCK = 1024  # columns per program

if triton is not None:

    @triton.jit
    def _embedding_kernel(ids, table, out, num_rows, width, table_stride, out_stride,
                          BLOCK: tl.constexpr):
        token = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        row = tl.load(ids + token).to(tl.int64)
        inside = (row >= 0) & (row < num_rows)
        mask = cols < width
        values = tl.load(table + row * table_stride + cols, mask=mask & inside, other=0)
        tl.store(out + token * out_stride + cols, values, mask=mask)

    _EMBEDDING = TritonLaunch(_embedding_kernel)


def embedding_lookup(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``table[ids]`` for a table [V, H] with unit column stride and ids [T] (int32 / int64)."""
    if triton is None:
        raise ImportError("the embedding kernel needs triton")
    if table.dim() != 2 or table.stride(1) != 1 or ids.dim() != 1:
        raise ValueError(f"a table [V, H] with unit column stride and ids [T] are needed, got "
                         f"{tuple(table.shape)} (strides {table.stride()}) and {tuple(ids.shape)}")
    num_tokens, width = ids.shape[0], table.shape[1]
    out = torch.empty((num_tokens, width), dtype=table.dtype, device=table.device)
    if num_tokens and width:
        block = min(next_pow2(width), _MAX_BLOCK)
        _EMBEDDING((num_tokens, triton.cdiv(width, block)),
                   (ids, table, out, table.shape[0], width, table.stride(0), out.stride(0)),
                   BLOCK=block, num_warps=4 if block >= 512 else 1)
    return out


def embed(module: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``module(ids)``, through the lookup kernel for a plain ``nn.Embedding`` on CUDA."""
    if (triton is not None and type(module) is nn.Embedding and ids.is_cuda and ids.dim() == 1
            and module.max_norm is None and module.weight.stride(1) == 1
            and ids.dtype in (torch.int32, torch.int64) and not torch.is_grad_enabled()):
        return embedding_lookup(module.weight, ids)
    return module(ids)
