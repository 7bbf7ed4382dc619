"""K-split projections for steps of 5 to 256 rows, their sum left to the next RMSNorm.

At these row counts cuBLAS covers a narrow projection (1024 outputs, as Qwen3-0.6B's o and down)
with a few dozen tiles, so most of the H200's SMs stream no weights. ``split_k_linear`` cuts K into
S slices and runs the S products as one strided batched GEMM with float32 outputs (a launch with S
times the tiles), and returns the partial sums as ``KParts``. The decoder hands them to the RMSNorm
that follows (``fused_ops.add_rms_norm``), whose kernel adds the S partials, rounds the sum to the
projection's dtype (what a whole product would have returned, up to the order of the K sum) and
goes on as before, so the split costs no launch of its own.

``split_k_parts`` decides from ``SPLIT_K_TABLE`` (per weight shape, the split count by row range,
measured on an H200 by ``scripts/split_k_sweep.py``); a shape or row count it does not list, a
weight that is not bfloat16/float16, a device other than the table's, autograd, or
``CADENCE_DISABLE_SPLIT_K=1`` keeps the whole product.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cadence.envs import read_envs
from cadence.model.capability import device_capability

__all__ = ["MIN_ROWS", "SPLIT_K_TABLE", "KParts", "split_k_linear", "split_k_parts", "table_parts",
           "weight_parts"]

logger = logging.getLogger(__name__)

ENABLED = not read_envs().disable_split_k
TABLE_CAPABILITY = (9, 0)
# Below this many rows the skinny and bulk kernels take the projections (skinny_gemm.py). Not 8:
# a decode step of 5-7 rows replays the 8-row graph, and its eager step must take the same
# kernels (the skinny kernel's bits hold across a row bucket, 5-8 rows, not across kernels):
# the split, or where the bulk GEMM's table lists the 8-row bucket, that kernel for 5-8 rows
# alike (decoder._split_parts).
MIN_ROWS = 5

# (N, K) -> ((most rows, split count), ...) by increasing row ranges from MIN_ROWS. H200,
# scripts/split_k_sweep.py, us a call against cuBLAS's whole product: o 1024 x 2048 at 64 rows
# 4.29 against 5.85, down 1024 x 3072 4.77 against 7.90; Qwen3-0.6B's step at batch 64 1.65
# against 1.76 ms (docs/perf.md, runs LA, LD, LF).
SPLIT_K_TABLE: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {
    (1024, 2048): ((64, 8), (128, 4), (256, 2)),
    (1024, 3072): ((64, 8), (128, 4), (256, 2)),
    (2048, 4096): ((16, 8), (64, 2)),  # Qwen3-30B-A3B's o: 6.69 against 9.37 at 8 rows
}

_HALF = (torch.bfloat16, torch.float16)
_BROKEN: list[bool] = []  # set once a batched product with float32 outputs failed


@dataclass(frozen=True)
class KParts:
    """A projection's output as ``parts`` [S, rows, N] float32 partial sums over K slices; the
    output is their sum rounded to ``dtype``."""

    parts: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]

    def total(self) -> torch.Tensor:
        """The whole product ``[rows, N]`` in ``dtype`` (the reference of the norm's sum)."""
        return self.parts.sum(0).to(self.dtype)


def table_parts(n: int, k: int, rows: int) -> int:
    """The table's split count for ``rows`` rows of an [N, K] weight (0: not listed)."""
    ranges = SPLIT_K_TABLE.get((n, k))
    if ranges is None or rows < MIN_ROWS:
        return 0
    for most, parts in ranges:
        if rows <= most:
            return parts if k % parts == 0 else 0
    return 0


def split_k_parts(x: torch.Tensor, weight: torch.Tensor) -> int:
    """How many K slices ``x @ weight.T`` takes (0: the whole product): ``x`` [rows, K] and
    ``weight`` [N, K] of one half-precision dtype on a CUDA device of the table's capability,
    no autograd, listed in ``SPLIT_K_TABLE``."""
    if x.dim() != 2 or x.shape[1] != weight.shape[-1] or x.requires_grad:
        return 0
    return weight_parts(weight, x.shape[0], x.dtype)


def weight_parts(weight: torch.Tensor, rows: int, dtype: torch.dtype) -> int:
    """``split_k_parts`` for an input of ``rows`` rows of ``dtype`` not computed yet (on the
    weight's device, not requiring grad)."""
    if not ENABLED or _BROKEN or weight.dim() != 2 or not weight.is_cuda:
        return 0
    if dtype not in _HALF or weight.dtype != dtype or not weight.is_contiguous():
        return 0
    if torch.is_grad_enabled() and weight.requires_grad:
        return 0
    parts = table_parts(weight.shape[0], weight.shape[1], rows)
    if parts == 0 or device_capability(weight.device) != TABLE_CAPABILITY:
        return 0
    return parts


def split_k_linear(x: torch.Tensor, weight: torch.Tensor, parts: int) -> KParts | torch.Tensor:
    """``x @ weight.T`` as ``parts`` float32 partial sums over K slices (``split_k_parts`` gave
    ``parts``); the whole product where this torch has no batched product with float32 outputs
    (then never again in this process)."""
    m, k = x.shape
    n = weight.shape[0]
    ks = k // parts
    # Views, no copies: slice s of x is x[:, s*ks:(s+1)*ks], of the weight its same columns.
    xs = x.contiguous().view(m, parts, ks).transpose(0, 1)
    ws = weight.contiguous().view(n, parts, ks).permute(1, 2, 0)
    if not x.is_cuda:  # the reference: float32 products of the same slices
        return KParts(torch.bmm(xs.float(), ws.float()), x.dtype)
    try:
        return KParts(torch.bmm(xs, ws, out_dtype=torch.float32), x.dtype)
    except TypeError as exc:  # torch before 2.8: no out_dtype (other errors are errors)
        if not _BROKEN:
            logger.warning("split-K projections are off: %s", str(exc).splitlines()[0])
            _BROKEN.append(True)
        return F.linear(x, weight)
