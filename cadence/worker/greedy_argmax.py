"""Greedy token choice on the GPU: each row's argmax of the logits, as ``torch.argmax``
defines it (the first index of the largest value; a NaN counts as larger than any number, and
-0.0 equals 0.0), in two short Triton launches.

``torch.argmax`` over one row of a large vocabulary runs in one launch whose reduction shape
suits the vocabulary size unevenly (26 us for Llama-3's 128,256 entries, 8.6 for Qwen3's
151,936 on an H200). Here every program takes ``BLOCK`` entries of a row and keeps its first
largest (as an int32 key whose order is the floats' with NaN on top), and one program per row
picks the first of the blocks' largest: 3-4 us at 1-8 rows.

``argmax_rows(logits, scratch)`` takes CUDA float32, bfloat16 or float16 logits (the model's
own, with no float32 copy) with unit column stride; anything else goes to ``torch.argmax``.
``ArgmaxScratch`` holds the per-block partials between the two launches (grown to the largest
batch seen, never per step).
"""

from __future__ import annotations

import torch

from cadence.runtime.triton_launch import TritonLaunch

__all__ = ["BLOCK", "ArgmaxScratch", "argmax_rows", "triton_applies", "triton_argmax"]

BLOCK = 4096  # entries per program; 2048-8192 measured within 0.4 us at 1-64 rows
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without Triton: torch.argmax everywhere
    triton = None


if triton is not None:
    _INT_MIN: tl.constexpr = tl.constexpr(-(2**31))
    _INT_MAX: tl.constexpr = tl.constexpr(2**31 - 1)

    @triton.jit
    def _block_max_kernel(logits, keys, idxs, V, stride, NB, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        b = tl.program_id(1)
        offs = b * BLOCK + tl.arange(0, BLOCK)
        inside = offs < V
        # float32 exactly holds any 16-bit float: the order, ties and NaNs are the logits'.
        x = tl.load(logits + row * stride + offs, mask=inside, other=0.0).to(tl.float32)
        x = tl.where(x == 0.0, 0.0, x)  # -0.0 -> 0.0: argmax takes them as equal
        bits = x.to(tl.int32, bitcast=True)
        # Negative floats' bits count down as the value does: flip them so that the key's
        # order is the value's; any NaN is the largest key, as it is argmax's largest value.
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        key = tl.where(x != x, _INT_MAX, key)
        key = tl.where(inside, key, _INT_MIN)  # below every value's key (-inf's included)
        k, i = tl.max(key, 0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(keys + row * NB + b, k)
        tl.store(idxs + row * NB + b, b * BLOCK + i)

    @triton.jit
    def _row_max_kernel(keys, idxs, out, NB, NB_P2: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, NB_P2)
        k = tl.load(keys + row * NB + offs, mask=offs < NB, other=_INT_MIN)
        i = tl.load(idxs + row * NB + offs, mask=offs < NB, other=_INT_MAX)
        # Each block's index is its first largest; the first block holding the row's
        # largest key holds the row's first.
        first = tl.min(tl.where(k == tl.max(k, 0), i, _INT_MAX), 0)
        tl.store(out + row, first.to(tl.int64))

    _BLOCK_MAX = TritonLaunch(_block_max_kernel)
    _ROW_MAX = TritonLaunch(_row_max_kernel)


class ArgmaxScratch:
    """The per-block partials of ``argmax_rows`` for one device: int32 keys and indices,
    [rows, blocks], reallocated only when a call needs more."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.idxs: torch.Tensor | None = None

    def get(self, rows: int, blocks: int, device: torch.device) -> tuple[torch.Tensor,
                                                                        torch.Tensor]:
        keys = self.keys
        if keys is None or keys.device != device or keys.numel() < rows * blocks:
            self.keys = torch.empty(rows * blocks, dtype=torch.int32, device=device)
            self.idxs = torch.empty(rows * blocks, dtype=torch.int32, device=device)
        assert self.keys is not None and self.idxs is not None
        return self.keys, self.idxs


def triton_applies(logits: torch.Tensor) -> bool:
    """Whether ``argmax_rows`` takes the Triton kernels for these logits."""
    return (triton is not None and logits.is_cuda and logits.dtype in _DTYPES
            and logits.dim() == 2 and logits.shape[0] > 0 and 0 < logits.shape[1] < 2**31 - BLOCK
            and logits.stride(1) == 1)


def argmax_rows(logits: torch.Tensor, scratch: ArgmaxScratch) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` ([rows] int64) for [rows, vocab] logits."""
    if not triton_applies(logits):
        return logits.argmax(dim=-1)
    return triton_argmax(logits, scratch)


def triton_argmax(logits: torch.Tensor, scratch: ArgmaxScratch) -> torch.Tensor:
    """The two launches ([rows, vocab] logits of ``_DTYPES`` with unit column stride, on a device
    Triton runs on: CUDA, or the CPU under Triton's interpreter)."""
    rows, vocab = logits.shape
    blocks = -(-vocab // BLOCK)
    keys, idxs = scratch.get(rows, blocks, logits.device)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    _BLOCK_MAX((rows, blocks), (logits, keys, idxs, vocab, logits.stride(0), blocks),
               num_warps=8, BLOCK=BLOCK)
    _ROW_MAX((rows,), (keys, idxs, out, blocks), num_warps=1,
             NB_P2=1 << max(0, blocks - 1).bit_length())
    return out
