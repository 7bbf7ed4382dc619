"""Rotary position embedding (rotate-half / NeoX layout) with default, linear and Llama-3 scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeParams:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_hf_config(cls, config: PretrainedConfig) -> RopeParams:
        """Read RoPE settings from either layout transformers has used.

        transformers 5 keeps everything in ``config.rope_parameters`` (``rope_theta`` included);
        older configs have ``config.rope_theta`` plus an optional ``config.rope_scaling`` dict.
        """
        params: dict[str, Any] = dict(
            getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        )
        if params and all(isinstance(v, dict) for v in params.values()):
            params = dict(params.get("full_attention") or next(iter(params.values())))
        theta = params.get("rope_theta", getattr(config, "rope_theta", None))
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"Unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}."
            )
        original = params.get("original_max_position_embeddings") or config.max_position_embeddings
        return cls(
            theta=float(theta if theta is not None else 10000.0),
            rope_type=rope_type,
            factor=float(params.get("factor", 1.0)),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(original),
        )


def inverse_frequencies(params: RopeParams, head_dim: int) -> torch.Tensor:
    """Float32 inverse frequencies ``[head_dim // 2]`` on the CPU."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (params.theta**exponents)
    if params.rope_type == "linear":
        return inv_freq / params.factor
    if params.rope_type == "llama3":
        return _llama3_scaled(inv_freq, params)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, p: RopeParams) -> torch.Tensor:
    # Long wavelengths are slowed down by `factor`, short ones kept, and the band between
    # original/high_freq_factor and original/low_freq_factor interpolated linearly in 1/wavelength.
    wavelen = 2 * math.pi / inv_freq
    long_limit = p.original_max_position_embeddings / p.low_freq_factor
    short_limit = p.original_max_position_embeddings / p.high_freq_factor
    slowed = torch.where(wavelen > long_limit, inv_freq / p.factor, inv_freq)
    t = (p.original_max_position_embeddings / wavelen - p.low_freq_factor) / (
        p.high_freq_factor - p.low_freq_factor
    )
    blended = (1 - t) * slowed / p.factor + t * slowed
    in_band = (wavelen >= short_limit) & (wavelen <= long_limit)
    return torch.where(in_band, blended, slowed)


class RotaryEmbedding(nn.Module):
    """Holds a ``[max_positions, head_dim]`` table: cos in the first half, sin in the second.

    The table is computed in float32 and stored in the module's dtype, like transformers casts
    cos/sin to the activations' dtype. It is a non-persistent buffer: after materializing a model
    built on the meta device, call :meth:`reset_table`.
    """

    def __init__(self, params: RopeParams, head_dim: int, max_positions: int) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}.")
        self.params = params
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.register_buffer("cos_sin", torch.empty(max_positions, head_dim), persistent=False)
        self.reset_table()

    @torch.no_grad()
    def reset_table(self) -> None:
        if self.cos_sin.is_meta:
            return
        device = self.cos_sin.device
        inv_freq = inverse_frequencies(self.params, self.head_dim).to(device)
        positions = torch.arange(self.max_positions, dtype=torch.float32, device=device)
        angles = positions[:, None] * inv_freq[None, :]
        self.cos_sin.copy_(torch.cat([angles.cos(), angles.sin()], dim=-1))

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[T, 1, head_dim // 2]`` for the given positions (broadcast over heads)."""
        return lookup_cos_sin(self.cos_sin, positions)


def lookup_cos_sin(
    cos_sin: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of a ``[max_positions, head_dim]`` table as cos and sin ``[T, 1, head_dim // 2]``."""
    cos, sin = cos_sin.index_select(0, positions).unsqueeze(1).chunk(2, dim=-1)
    return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, heads, head_dim]`` (first half paired with second half)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
