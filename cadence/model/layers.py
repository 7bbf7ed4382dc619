"""Small building blocks of the decoder: RMSNorm, Gemma's (1 + w) RMSNorm and the SwiGLU activation.

Both run the fused kernels of :mod:`cadence.model.fused_ops` on CUDA and transformers' plain
torch arithmetic elsewhere. ``RMSNorm.project`` hands its input to the projection that takes the
norm's output, which runs the norm in its loads where it can (``SkinnyLinear.forward_norm``).
"""

from __future__ import annotations

import torch
from torch import nn

from cadence.model import fused_ops
from cadence.model.fused_ops import silu_and_mul
from cadence.model.split_k import KParts

__all__ = ["GemmaRMSNorm", "RMSNorm", "silu_and_mul"]


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, computed in float32.

    The arithmetic matches transformers' (normalize in float32, cast back, then scale), so the
    torch path is bit-identical in float32 and rounding-identical in half precision.
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_ops.rms_norm(x, self.weight, self.eps)

    def add_and_norm(
        self, x: torch.Tensor | KParts, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(residual + x), residual + x)``: the normed input and the new residual
        (``x`` may be a K-split projection's partial sums)."""
        return fused_ops.add_rms_norm(x, residual, self.weight, self.eps)

    def project(
        self, linear: nn.Module, x: torch.Tensor | KParts, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(linear(h), s)`` for ``h, s = add_and_norm(x, residual)`` (``h = self(x)`` and
        ``s = x`` without a residual); a skinny projection takes the norm into its loads for
        few rows (``SkinnyLinear.forward_norm``: the same bits, or for wide rows within a
        rounding)."""
        forward_norm = getattr(linear, "forward_norm", None)  # SkinnyLinear, Fp8Linear
        if forward_norm is not None and not isinstance(x, KParts):
            return forward_norm(x, residual, self.weight, self.eps)
        return fused_ops.norm_and_project(linear, x, residual, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class GemmaRMSNorm(nn.Module):
    """``norm(x) * (1 + w)``, both in float32, then cast to x's dtype (transformers' Gemma norm,
    which scales before the cast, unlike Llama's)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)
