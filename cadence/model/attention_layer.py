"""The attention block of a decoder layer: fused qkv projection, q/k norms and RoPE, paged
attention through the backend, output projection (all-reduced under tensor parallelism).

One block serves every family: the layer's sliding window, score scale and soft cap come from
the architecture; Gemma's (1 + w) q/k norms run on their own, the others' go with RoPE to the
backend (which applies them in its decode kernel's loads where it can).
"""

from __future__ import annotations

import torch
from torch import nn

from cadence.model.arch import DecoderArch
from cadence.model.attention_metadata import (
    AttentionBackend,
    AttentionMetadata,
    OutputRows,
    QKRope,
)
from cadence.model.bulk_mma import mma_listed
from cadence.model.layers import GemmaRMSNorm, RMSNorm
from cadence.model.parallel import all_reduce


class SelfAttention(nn.Module):
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
        norm = GemmaRMSNorm if arch.gemma else RMSNorm
        self.q_norm = norm(arch.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        self.k_norm = norm(arch.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        # Gemma's norms scale by (1 + w): not the fused kernel's arithmetic.
        self.fused_qk_norm = not arch.gemma
        # An FP8 KV cache's dequantization scales (a checkpoint's k_scale / v_scale, else 1).
        self.k_scale = 1.0
        self.v_scale = 1.0
        # (rows, mode, weight) -> whether the qkv projection of that many rows is a bulk kernel.
        self._releases_early: dict[tuple[int, str, int, torch.dtype], bool] = {}

    def permute_qk_dims(self, perm: torch.Tensor) -> None:
        """Reorder each q and k head's dimensions by ``perm`` (``x[..., perm]``): the rows of
        their projection (and bias), and their norms' weights. Scores do not change."""
        d = self.head_dim
        q_rows = (torch.arange(self.q_size // d)[:, None] * d + perm).flatten()
        k_rows = (torch.arange(self.kv_size // d)[:, None] * d + perm).flatten() + self.q_size
        rows = torch.cat([q_rows, k_rows, torch.arange(self.q_size + self.kv_size,
                                                       self.q_size + 2 * self.kv_size)])
        rows = rows.to(self.qkv_proj.weight.device)
        self.qkv_proj.weight.copy_(self.qkv_proj.weight[rows])
        if self.qkv_proj.bias is not None:
            self.qkv_proj.bias.copy_(self.qkv_proj.bias[rows])
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.weight.copy_(norm.weight[perm.to(norm.weight.device)])

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: torch.Tensor,
        attn: AttentionMetadata,
    ) -> torch.Tensor:
        return self.attend(self.qkv_proj(x), positions, cos_sin, kv_cache, attn,
                           qkv_mode="plain")

    def attend(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: torch.Tensor,
        attn: AttentionMetadata,
        rows: OutputRows | None = None,
        qkv_mode: str = "norm",
    ) -> torch.Tensor:
        """``forward`` from the qkv projection's output on (the decoder layer projects its
        norm's input itself, see ``RMSNorm.project``); with ``rows``, those rows only.
        ``qkv_mode``: how that projection ran (the bulk kernels' mode: "norm" where the norm
        before went into it)."""
        out = self.o_proj(self.attend_heads(qkv, positions, cos_sin, kv_cache, attn, rows,
                                            qkv_mode))
        return all_reduce(out) if self.tp else out

    def attend_heads(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: torch.Tensor,
        attn: AttentionMetadata,
        rows: OutputRows | None = None,
        qkv_mode: str = "norm",
    ) -> torch.Tensor:
        """``attend`` up to the output projection: the heads' outputs, ``[T, q_size]``; with
        ``rows``, every token's K/V stored and ``rows``' outputs only, ``[R, q_size]``."""
        num_tokens = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        q_weight = k_weight = None
        eps = 0.0
        if self.q_norm is not None and self.k_norm is not None:
            if self.fused_qk_norm:
                q_weight, k_weight, eps = self.q_norm.weight, self.k_norm.weight, self.q_norm.eps
            else:
                q, k = self.q_norm(q), self.k_norm(k)
        # The backend applies the q/k norms and RoPE (in its decode kernel where it can).
        args = (self.scale, self.sliding_window, self.softcap, self.k_scale, self.v_scale,
                QKRope(positions, cos_sin, q_weight, k_weight, eps))
        if rows is None:
            # Separate q/k norm launches (Gemma's) stand between the projection and attention.
            early = (attn.is_decode_only and (q_weight is not None or self.q_norm is None)
                     and self._qkv_releases_early(num_tokens, qkv_mode))
            out = self.backend.forward(q, k, v, kv_cache, attn, *args, qkv_releases_early=early)
            return out.reshape(num_tokens, self.q_size)
        forward_rows = getattr(self.backend, "forward_rows", None)
        if forward_rows is not None:
            out = forward_rows(q, k, v, kv_cache, attn, rows, *args)
        else:  # a backend without it attends every token; the rows are kept
            out = self.backend.forward(q, k, v, kv_cache, attn, *args).index_select(0, rows.index)
        return out.reshape(rows.count, self.q_size)

    def _qkv_releases_early(self, rows: int, mode: str) -> bool:
        """Whether the qkv projection of ``rows`` rows in ``mode`` runs the bulk GEMM, which
        lets the next launch (decode attention) start before it ends."""
        weight = self.qkv_proj.weight
        key = (rows, mode, weight.data_ptr(), weight.dtype)
        found = self._releases_early.get(key)
        if found is None:
            found = self._releases_early[key] = mma_listed(weight, mode, rows)
        return found

