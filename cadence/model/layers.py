"""Small building blocks of the decoder: RMSNorm and the SwiGLU activation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, computed in float32.

    The arithmetic matches transformers' (normalize in float32, cast back, then scale), so the
    result is bit-identical in float32 and rounding-identical in half precision.
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused ``[..., 2 * d]`` gate/up projection: ``silu(gate) * up``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
