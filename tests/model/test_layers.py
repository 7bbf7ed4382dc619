"""RMSNorm and SwiGLU against transformers' definitions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from cadence.model.layers import RMSNorm, silu_and_mul


def _assert_identical(ours, theirs, x: torch.Tensor, weight: torch.Tensor) -> None:
    """Both norms with ``weight``, in x's dtype, give the same bits."""
    ours, theirs = ours.to(x.dtype), theirs.to(x.dtype)
    with torch.no_grad():
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
    out = ours(x)
    assert out.dtype == x.dtype
    assert torch.equal(out, theirs(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_is_identical_to_transformers(dtype):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(7, 3, 48, generator=gen) * 5).to(dtype)
    weight = 1 + torch.randn(48, generator=gen)
    _assert_identical(RMSNorm(48, 1e-5), LlamaRMSNorm(48, eps=1e-5), x, weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_rmsnorm_is_identical_to_transformers(dtype):
    """(1 + w) scaling in float32, one rounding to the model dtype at the end: bit for bit
    transformers' Gemma 2 norm (the rounding points matter in bf16)."""
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    from cadence.model.layers import GemmaRMSNorm

    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(64, 256, generator=gen) * 3).to(dtype)
    weight = torch.randn(256, generator=gen) * 0.5
    _assert_identical(GemmaRMSNorm(256, 1e-6), Gemma2RMSNorm(256, eps=1e-6), x, weight)


def test_silu_and_mul_uses_first_half_as_gate():
    gate, up = torch.randn(4, 6), torch.randn(4, 6)
    torch.testing.assert_close(silu_and_mul(torch.cat([gate, up], -1)), F.silu(gate) * up)
