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
from cadence.model.attention_metadata import AttentionBackend, AttentionMetadata
from cadence.model.fused_ops import qk_norm_rope
from cadence.model.parallel import all_reduce


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


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """GeGLU on a fused ``[..., 2 * d]`` gate/up projection: ``gelu_tanh(gate) * up``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


class GemmaAttention(nn.Module):
    def __init__(self, arch: DecoderArch, backend: AttentionBackend, layer: int) -> None:
        super().__init__()
        self.num_heads = arch.num_heads
        self.num_kv_heads = arch.num_kv_heads
        self.head_dim = arch.head_dim
        self.q_size = arch.q_size
        self.kv_size = arch.kv_size
        self.scale = arch.scale
        self.sliding_window = arch.window(layer)
        self.softcap = arch.attn_softcap
        self.backend = backend
        self.tp = arch.tp_size > 1
        # Rows: [q | k | v], in that order (the loader fills the slices).
        self.qkv_proj = nn.Linear(arch.hidden_size, arch.q_size + 2 * arch.kv_size, arch.qkv_bias)
        self.o_proj = nn.Linear(arch.q_size, arch.hidden_size, bias=arch.o_bias)
        self.q_norm = GemmaRMSNorm(arch.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        self.k_norm = GemmaRMSNorm(arch.head_dim, arch.rms_norm_eps) if arch.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: torch.Tensor,
        attn: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = qk_norm_rope(q, k, positions, cos_sin, None, None, 0.0)
        out = self.backend.forward(
            q, k, v, kv_cache, attn, self.scale, self.sliding_window, self.softcap
        )
        out = self.o_proj(out.reshape(num_tokens, self.q_size))
        return all_reduce(out) if self.tp else out


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
        self.self_attn = GemmaAttention(arch, backend, layer)
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
