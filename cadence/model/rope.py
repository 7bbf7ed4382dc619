"""Rotary position embedding (NeoX layout): default, linear, llama3, yarn, dynamic, longrope.

Partial rotation (``partial_rotary_factor`` < 1, Phi-3's family: Phi-4-mini) rotates the first
R of a head's D dimensions, pairing i with i + R/2, and passes the rest through. Here it takes
no kernel of its own: the checkpoint's q and k rows are permuted within each head
(``rotary_permutation``) so that the rotated pairs sit at (j, j + D/2) for j < R/2 and the
passed-through dimensions at the other pairs, whose table entries are cos 1, sin 0. Scores are
sums over dimensions and so do not change; the cache holds the permuted keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")


@dataclass(frozen=True)
class RopeParams:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # The config's max_position_embeddings (dynamic: the trained length).
    max_position_embeddings: int = 8192
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    truncate: bool = True
    # yarn and longrope: the factor cos and sin are multiplied by (None: derived from `factor`).
    attention_factor: float | None = None
    # longrope: per-frequency divisors for sequences up to / beyond the original length.
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    # The share of each head's dimensions that rotate (the rest pass through).
    partial_rotary_factor: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got "
                             f"{self.partial_rotary_factor}.")
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"Unsupported rope_type {self.rope_type!r}; "
                f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}."
            )
        if self.rope_type == "longrope" and not (self.short_factor and self.long_factor):
            raise ValueError("longrope scaling needs short_factor and long_factor.")

    def rotary_dim(self, head_dim: int) -> int:
        """The rotated dimensions of a head (transformers' ``int(head_dim * factor)``)."""
        dim = int(head_dim * self.partial_rotary_factor)
        if dim < 2 or dim % 2:
            raise ValueError(f"partial_rotary_factor {self.partial_rotary_factor} rotates {dim} "
                             f"of {head_dim} dimensions; an even number of at least 2 is needed.")
        return dim

    @property
    def context_length(self) -> int:
        """The longest sequence the model may run: max_position_embeddings, or the length the
        scaling is made for where that is longer and the rotation does not depend on the length
        (vLLM's derivation): linear, max_position_embeddings x factor; yarn, the original length
        x factor. (dynamic stretches its base with the length in transformers, longrope switches
        factors at the original length, llama3's configs already name the scaled length.)"""
        scaled = 0
        if self.rope_type == "linear":
            scaled = int(self.max_position_embeddings * self.factor)
        elif self.rope_type == "yarn":
            scaled = int(self.original_max_position_embeddings * self.factor)
        return max(self.max_position_embeddings, scaled)

    @classmethod
    def from_hf_config(
        cls, config: PretrainedConfig, layer_type: str = "full_attention"
    ) -> RopeParams:
        """Read RoPE settings from either layout transformers has used.

        transformers 5 keeps everything in ``config.rope_parameters`` (``rope_theta`` included),
        per layer type for models that rotate layers differently (Gemma 3: ``layer_type``);
        older configs have ``config.rope_theta`` plus an optional ``config.rope_scaling`` dict
        (and Gemma 3's ``rope_local_base_freq`` for its sliding layers).
        """
        params: dict[str, Any] = dict(
            getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        )
        if params and all(isinstance(v, dict) for v in params.values()):
            params = dict(params.get(layer_type) or next(iter(params.values())))
        elif layer_type == "sliding_attention" and hasattr(config, "rope_local_base_freq"):
            params = {"rope_theta": config.rope_local_base_freq}
        theta = params.get("rope_theta", getattr(config, "rope_theta", None))
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type == "su":  # Phi-3's early name for longrope
            rope_type = "longrope"
        partial = params.get("partial_rotary_factor",
                             getattr(config, "partial_rotary_factor", None))
        max_positions = int(config.max_position_embeddings)
        original = int(
            params.get("original_max_position_embeddings")
            or getattr(config, "original_max_position_embeddings", None)
            or max_positions
        )
        factor = params.get("factor")
        if factor is None:
            # yarn and longrope derive it from the two lengths, as transformers does.
            factor = max_positions / original if rope_type in ("yarn", "longrope") else 1.0
        attention_factor = params.get("attention_factor")
        return cls(
            theta=float(theta if theta is not None else 10000.0),
            rope_type=rope_type,
            factor=float(factor),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=original,
            max_position_embeddings=max_positions,
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            mscale=float(params.get("mscale") or 0.0),
            mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
            truncate=bool(params.get("truncate", True)),
            attention_factor=None if attention_factor is None else float(attention_factor),
            short_factor=tuple(float(f) for f in params.get("short_factor") or ()),
            long_factor=tuple(float(f) for f in params.get("long_factor") or ()),
            partial_rotary_factor=float(partial if partial is not None else 1.0),
        )


def inverse_frequencies(
    params: RopeParams, head_dim: int, seq_len: int | None = None, long: bool = False
) -> torch.Tensor:
    """Float32 inverse frequencies ``[head_dim // 2]`` on the CPU.

    ``seq_len`` matters for "dynamic" only (the length the base is stretched for; at most
    ``max_position_embeddings`` means no stretch); ``long`` picks longrope's long factors."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    if params.rope_type == "dynamic":
        length = max(seq_len or 0, params.max_position_embeddings)
        stretch = params.factor * length / params.max_position_embeddings - (params.factor - 1)
        base = params.theta * stretch ** (head_dim / (head_dim - 2))
        return 1.0 / (base**exponents)
    inv_freq = 1.0 / (params.theta**exponents)
    if params.rope_type == "linear":
        return inv_freq / params.factor
    if params.rope_type == "llama3":
        return _llama3_scaled(inv_freq, params)
    if params.rope_type == "yarn":
        return _yarn_scaled(params, head_dim)
    if params.rope_type == "longrope":
        factors = params.long_factor if long else params.short_factor
        if len(factors) != head_dim // 2:
            raise ValueError(f"longrope factors: {len(factors)} given, {head_dim // 2} needed.")
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * params.theta**exponents)
    return inv_freq


def attention_scaling(params: RopeParams) -> float:
    """The factor cos and sin are multiplied by (yarn and longrope; 1 for the others)."""
    if params.attention_factor is not None:
        return params.attention_factor
    if params.rope_type == "yarn":
        if params.mscale and params.mscale_all_dim:
            return _yarn_mscale(params.factor, params.mscale) / _yarn_mscale(
                params.factor, params.mscale_all_dim
            )
        return _yarn_mscale(params.factor, 1.0)
    if params.rope_type == "longrope" and params.factor > 1.0:
        original = params.original_max_position_embeddings
        return math.sqrt(1 + math.log(params.factor) / math.log(original))
    return 1.0


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_scaled(p: RopeParams, head_dim: int) -> torch.Tensor:
    # Frequencies that turn more than beta_fast times over the original length keep their value
    # (extrapolation), those turning fewer than beta_slow times are divided by `factor`
    # (interpolation), with a linear ramp over the dimensions between.
    def dim_of(rotations: float) -> float:
        turns = p.original_max_position_embeddings / (rotations * 2 * math.pi)
        return head_dim * math.log(turns) / (2 * math.log(p.theta))

    low, high = dim_of(p.beta_fast), dim_of(p.beta_slow)
    if p.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    pos_freqs = p.theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    return (1.0 / (p.factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep


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


def context_length(config: PretrainedConfig) -> int:
    """The longest sequence a checkpoint may run (``RopeParams.context_length``); Gemma 3's
    max_position_embeddings already is its scaled length (vLLM's exception)."""
    if str(getattr(config, "model_type", "")).startswith("gemma3"):
        return int(config.max_position_embeddings)
    return RopeParams.from_hf_config(config).context_length


def longrope_switch_len(config: PretrainedConfig, max_model_len: int) -> int:
    """longrope's original length where sequences may grow past it (they switch to the long
    factors there: ``Scheduler``'s ``rope_switch_len``); 0 otherwise."""
    params = RopeParams.from_hf_config(config)
    original = params.original_max_position_embeddings
    return original if params.rope_type == "longrope" and max_model_len > original else 0


class RotaryEmbedding(nn.Module):
    """Holds a ``[max_positions, head_dim]`` table: cos in the first half, sin in the second.

    The table is computed in float32 and stored in the module's dtype, like transformers casts
    cos/sin to the activations' dtype. It is a non-persistent buffer: after materializing a model
    built on the meta device, call :meth:`reset_table`.

    longrope has two tables, one above the other (``2 * max_positions`` rows): the short factors'
    first, then the long factors' (row ``long_offset + position``). "dynamic" is the plain table:
    positions never exceed max_position_embeddings here, below which transformers does not
    stretch the base.
    """

    def __init__(self, params: RopeParams, head_dim: int, max_positions: int) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}.")
        self.params = params
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.long_offset = max_positions if params.rope_type == "longrope" else 0
        rows = max_positions + self.long_offset
        self.rotary_dim = params.rotary_dim(head_dim)
        self.register_buffer("cos_sin", torch.empty(rows, head_dim), persistent=False)
        self.reset_table()

    @torch.no_grad()
    def reset_table(self) -> None:
        if self.cos_sin.is_meta:
            return
        device = self.cos_sin.device
        scaling = attention_scaling(self.params)
        positions = torch.arange(self.max_positions, dtype=torch.float32, device=device)
        tables = []
        half, rotated = self.head_dim // 2, self.rotary_dim // 2
        for long in (False, True) if self.long_offset else (False,):
            inv_freq = inverse_frequencies(self.params, self.rotary_dim, long=long).to(device)
            angles = positions[:, None] * inv_freq[None, :]
            # Pairs past the rotated ones (partial rotation) pass through: cos 1, sin 0.
            cos = torch.ones(self.max_positions, half, device=device)
            sin = torch.zeros(self.max_positions, half, device=device)
            cos[:, :rotated] = angles.cos() * scaling
            sin[:, :rotated] = angles.sin() * scaling
            tables.append(torch.cat([cos, sin], dim=-1))
        self.cos_sin.copy_(torch.cat(tables))

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[T, 1, head_dim // 2]`` for the given positions (broadcast over heads)."""
        return lookup_cos_sin(self.cos_sin, positions)


def longrope_rows(positions: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                  original: int, long_offset: int) -> torch.Tensor:
    """Rope table rows of longrope for a pass's tokens (sequence ``i`` owns tokens
    ``query_start_loc[i]:query_start_loc[i + 1]``): the long factors' rows (``long_offset`` +
    position) for every token of a sequence longer than ``original`` tokens after this pass, the
    short ones' otherwise, as transformers picks the factors per forward from its longest
    position. On the device, no sync. A sequence that grows past the original length while
    decoding keeps its earlier keys as they were rotated (transformers' Phi-3 recomputes its
    whole cache at that step; the engine's scheduler recomputes the sequence there). A
    position at or past ``long_offset`` already is a long row: the engine's runner gives those
    for the prefill chunks of a prompt longer than ``original``, whose chunks end before it."""
    tokens = torch.arange(positions.shape[0], device=positions.device,
                          dtype=query_start_loc.dtype)
    seq = torch.searchsorted(query_start_loc[1:], tokens, right=True)
    seq = seq.clamp_(max=seq_lens.shape[0] - 1)  # padding tokens past the last sequence
    long = (seq_lens[seq] > original) & (positions < long_offset)
    return positions + long.to(positions.dtype) * long_offset


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


def rotary_permutation(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """For partial rotation: ``perm`` such that ``x[..., perm]`` (a head's dimensions, as the
    checkpoint orders them) puts the rotated pair (i, i + R/2) at (i, i + D/2) and the
    passed-through dimensions at the pairs past R/2, the table's cos 1, sin 0 entries."""
    half, rotated = head_dim // 2, rotary_dim // 2
    rest = list(range(rotary_dim, head_dim))
    first = list(range(rotated)) + rest[: half - rotated]
    second = list(range(rotated, rotary_dim)) + rest[half - rotated:]
    return torch.tensor(first + second, dtype=torch.long)
