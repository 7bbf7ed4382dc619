"""The contract between the model runner, the model and the attention backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from cadence.model.fused_ops import qk_norm_rope


@dataclass
class AttentionMetadata:
    """Describes one forward pass over a flat batch of T tokens from B sequences.

    Sequence ``i`` owns tokens ``query_start_loc[i]:query_start_loc[i+1]``; after this pass it has
    ``seq_lens[i]`` tokens in total, so its queries sit at positions
    ``seq_lens[i] - query_len_i ... seq_lens[i] - 1``. Tokens past ``num_actual_tokens`` are
    padding (CUDA-graph buckets): their slot is the reserved dummy slot and their output is unused.
    A padded sequence has ``seq_lens == 0`` and an empty query range.

    ``fresh_prompt``: the pass is one sequence from position 0 (no cached context), its tokens
    first and padding after them, so a backend may attend causally over the pass's own q, k and
    v as one dense sequence (padding rows only see earlier rows; their output is unused).
    """

    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # [B + 1] int32, on the model's device
    seq_lens: torch.Tensor  # [B] int32, on the model's device
    block_tables: torch.Tensor  # [B, max_blocks_per_seq] int32, on the model's device
    slot_mapping: torch.Tensor  # [T] int64: block_id * block_size + offset of each token
    # Host copies (numpy-backed CPU tensors) for backends that loop on the host.
    query_start_loc_cpu: torch.Tensor | None = None
    seq_lens_cpu: torch.Tensor | None = None
    fresh_prompt: bool = False

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


@dataclass(frozen=True)
class OutputRows:
    """The tokens of a pass whose final hidden states the caller needs: each sequence's last
    (the one a step samples from). The last layer stores every token's K/V but attends,
    projects and runs its MLP for these rows only, and the model returns ``[R, hidden]``.

    ``index[i]`` is the flat index of sequence ``i``'s last token, for the pass's first ``R``
    sequences; ``metadata`` lays those tokens out as a decode pass over the same sequences (one
    query each, the pass's ``seq_lens`` and block tables). Its ``slot_mapping`` is not read:
    the pass has stored every token's K/V before these rows attend."""

    index: torch.Tensor  # [R] int32 or int64
    metadata: AttentionMetadata

    @property
    def count(self) -> int:
        return self.index.shape[0]


@dataclass(frozen=True)
class QKRope:
    """The q/k norms (both weights given) and rotate-half RoPE still to apply to a pass's q and
    k (``fused_ops.qk_norm_rope``'s arguments): a backend applies them in its decode kernel's
    loads where it can, else before attending."""

    positions: torch.Tensor  # [T]
    cos_sin: torch.Tensor  # [max_positions, head_dim]: cos in the first half, sin in the second
    q_weight: torch.Tensor | None = None
    k_weight: torch.Tensor | None = None
    eps: float = 0.0

    def apply(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, k)`` normed and rotated by ``fused_ops.qk_norm_rope`` (new tensors)."""
        return qk_norm_rope(q, k, self.positions, self.cos_sin, self.q_weight, self.k_weight,
                            self.eps)


class AttentionBackend(Protocol):
    """Writes this pass's K/V into the paged cache, then attends.

    ``kv_cache`` is one layer's cache, ``[2, num_blocks, block_size, num_kv_heads, head_dim]``
    (index 0 = keys, 1 = values). q is ``[T, num_heads, head_dim]``, k and v are
    ``[T, num_kv_heads, head_dim]``; the result is ``[T, num_heads, head_dim]``.
    Causal within each sequence; grouped-query attention when num_heads > num_kv_heads.
    With ``sliding_window`` W > 0 a query at position p sees only keys at p - W + 1 ... p; with
    ``softcap`` c > 0 the scaled scores s are capped to ``c * tanh(s / c)`` before the softmax.
    An FP8 cache (``float8_e4m3fn``) stores ``k / k_scale`` and ``v / v_scale``. With ``rope``,
    q and k are not yet normed and rotated: the backend applies ``rope`` first.
    ``qkv_releases_early``: the projection that made q, k and v is a bulk kernel that lets the
    next launch start before it ends (a hint a decode kernel may load ahead on).
    """

    name: str

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int = 0,
        softcap: float = 0.0,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        rope: QKRope | None = None,
        qkv_releases_early: bool = False,
    ) -> torch.Tensor: ...
