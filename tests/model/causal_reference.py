"""Causal softmax attention in float64, written out (no torch attention call): the reference
the dense causal kernel and the attention layer's tests compare against."""

from __future__ import annotations

import torch


def causal_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """One sequence from position 0: q ``[T, H, d]``, k and v ``[T, KV, d]`` (grouped-query
    heads) to ``[T, H, d]`` in float64. With a window, query t sees keys t - window + 1 to t
    (transformers' sliding window); with a cap, scores are cap * tanh(score / cap) (Gemma 2's
    soft-capping)."""
    t, h, _ = q.shape
    group = h // k.shape[1]
    kk = k.double().repeat_interleave(group, 1).transpose(0, 1)  # [H, T, D]
    vv = v.double().repeat_interleave(group, 1).transpose(0, 1)
    s = q.double().transpose(0, 1) @ kk.transpose(1, 2) * scale  # [H, T, T]
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    pos = torch.arange(t, device=q.device)
    hidden = pos[None, :] > pos[:, None]  # [query, key]
    if window > 0:
        hidden |= pos[None, :] <= pos[:, None] - window
    s = s.masked_fill(hidden, float("-inf"))
    return (s.softmax(-1) @ vv).transpose(0, 1)
