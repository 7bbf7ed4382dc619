"""The Gemma 2 / Gemma 3 decoder layer: (1 + w) norms around attention and MLP, GELU-tanh.

Gemma's layer norms the attention and MLP outputs before adding them to the residual stream,
so it hands the full hidden state to the next layer (no separate residual: it returns ``None``
in its place, which :class:`cadence.model.decoder.CausalLM` passes back unchanged).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadence.model.arch import DecoderArch
from cadence.model.attention_layer import SelfAttention
from cadence.model.attention_metadata import AttentionBackend, AttentionMetadata
from cadence.model.layers import GemmaRMSNorm
from cadence.model.parallel import all_reduce


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """GeGLU on a fused ``[..., 2 * d]`` gate/up projection: ``gelu_tanh(gate) * up``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


class GemmaMLP(nn.Module):
    def __init__(self, arch: DecoderArch) -> None:
        super().__init__()
        # Rows: [gate | up].
        self.gate_up_proj = nn.Linear(
            arch.hidden_size, 2 * arch.intermediate_size, bias=arch.mlp_bias
        )
        self.down_proj = nn.Linear(arch.intermediate_size, arch.hidden_size, bias=arch.mlp_bias)
        self.tp = arch.tp_size > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(gelu_tanh_and_mul(self.gate_up_proj(x)))
        return all_reduce(out) if self.tp else out


class GemmaDecoderLayer(nn.Module):
    def __init__(self, arch: DecoderArch, backend: AttentionBackend, layer: int) -> None:
        super().__init__()
        # Gemma 3's sliding layers rotate with the local rope base.
        self.local_rope = arch.local_rope and arch.window(layer) > 0
        eps = arch.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(arch.hidden_size, eps)
        self.self_attn = SelfAttention(arch, backend, layer)
        self.post_attention_layernorm = GemmaRMSNorm(arch.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(arch.hidden_size, eps)
        self.mlp = GemmaMLP(arch)
        self.post_feedforward_layernorm = GemmaRMSNorm(arch.hidden_size, eps)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: torch.Tensor,
        attn: AttentionMetadata,
    ) -> tuple[torch.Tensor, None]:
        """``x`` is the hidden state (``residual`` is always None); returns the next one."""
        h = self.self_attn(self.input_layernorm(x), positions, cos_sin, kv_cache, attn)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(h), None
