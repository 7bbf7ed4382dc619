"""RMSNorm and SwiGLU against transformers' definitions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from cadence.model.layers import RMSNorm, silu_and_mul


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_is_identical_to_transformers(dtype):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(7, 3, 48, generator=gen) * 5).to(dtype)
    ours, theirs = RMSNorm(48, 1e-5).to(dtype), LlamaRMSNorm(48, eps=1e-5).to(dtype)
    weight = 1 + torch.randn(48, generator=gen)
    with torch.no_grad():
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
    out = ours(x)
    assert out.dtype == dtype
    assert torch.equal(out, theirs(x))


def test_silu_and_mul_uses_first_half_as_gate():
    gate, up = torch.randn(4, 6), torch.randn(4, 6)
    torch.testing.assert_close(silu_and_mul(torch.cat([gate, up], -1)), F.silu(gate) * up)
