"""``AttentionBackend`` on the Triton kernels of :mod:`cadence.model.triton_attention`: decode
steps through the paged decode kernel (which stores the new K/V, and applies the q/k norms and
RoPE in its loads where it can), every other step through the q/k norm + RoPE launch (which
stores the K/V, except into an FP8 cache; a store launch of its own otherwise) and the varlen
kernel, or, for a lone prompt from position 0, dense attention over its own keys (the Triton
kernel of short query blocks or cuDNN, ``dense_prefill``)."""

from __future__ import annotations

import torch

from cadence.envs import read_envs
from cadence.model.attention_metadata import AttentionMetadata, OutputRows, QKRope
from cadence.model.attention_tiles import decode_config
from cadence.model.dense_prefill import DensePrefill
from cadence.model.fused_ops import KVStore, qk_norm_rope_triton
from cadence.model.triton_attention import (
    _last_dim_contiguous,
    _require_triton,
    paged_decode_attention,
    paged_varlen_attention,
    rope_fusable,
    store_kv_cache,
)


class TritonAttentionBackend:
    """``AttentionBackend`` on Triton kernels: store K/V, then decode or varlen prefill."""

    name = "triton"

    def __init__(self, fuse_rope: bool | None = None, num_sms: int | None = None,
                 dense_prefill: DensePrefill | None = None, early_decode: bool = True) -> None:
        _require_triton()
        self._num_sms: dict[int, int] = {}
        self._fixed_sms = num_sms  # the device's SM count when None (tests pin it)
        # Decode steps apply the q/k norms and RoPE in the attention kernel's loads, and other
        # steps' rope launch stores their K/V (one kernel fewer per layer either way); off:
        # fused_ops.qk_norm_rope first, and a store launch of its own.
        self.fuse_rope = not read_envs().disable_fused_rope if fuse_rope is None else fuse_rope
        envs = read_envs()
        self.dense_prefill = dense_prefill or DensePrefill(
            not envs.disable_dense_prefill, use_triton=not envs.disable_triton_dense_prefill)
        # Whether decode may take decode_config's early load order; off: the plain order (a
        # switch for measurements).
        self.early_decode = early_decode

    def dense_prefill_min_tokens(self, dtype: torch.dtype, num_heads: int, num_kv_heads: int,
                                 head_dim: int, cache_dtype: torch.dtype, sliding_window: int,
                                 softcap: float, device: torch.device) -> int | None:
        """The fewest tokens of a lone fresh prompt that this layer attends densely, None where
        it never does (a first small call of each kernel tells whether it runs the shape)."""
        dense = self.dense_prefill
        if (dense.supports(dtype, head_dim, cache_dtype, sliding_window, softcap, device)
                and dense.probe(dtype, num_heads, num_kv_heads, head_dim, device,
                                sliding_window, softcap)):
            return dense.min_tokens
        return None

    def num_sms(self, device: torch.device) -> int:
        if self._fixed_sms is not None:
            return self._fixed_sms
        if device.type != "cuda":  # Triton's interpreter: no SMs to size grids by
            return 1
        index = device.index if device.index is not None else torch.cuda.current_device()
        found = self._num_sms.get(index)
        if found is None:
            found = torch.cuda.get_device_properties(index).multi_processor_count
            self._num_sms[index] = found
        return found

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
    ) -> torch.Tensor:
        _check_groups(q, kv_cache)
        decode = metadata.is_decode_only
        fuse = rope is not None and self.fuse_rope and decode and rope_fusable(q, k, rope)
        if decode:
            if rope is not None and not fuse:
                q, k = rope.apply(q, k)
            q = _last_dim_contiguous(q)
            out = torch.empty_like(q)
            sms = self.num_sms(q.device)
            config = None if self.early_decode else decode_config(q.dtype == torch.float32)
            paged_decode_attention(
                q, kv_cache, metadata, scale, out, sms, k=k, v=v,
                sliding_window=sliding_window, softcap=softcap, k_scale=k_scale, v_scale=v_scale,
                rope=rope if fuse else None, config=config,
                # A rope launch of its own stands between the qkv projection and this one.
                qkv_releases_early=qkv_releases_early and (fuse or rope is None),
            )  # fmt: skip
        else:
            q, k = self._rope_and_store(q, k, v, kv_cache, metadata, k_scale, v_scale, rope)
            dense = self.dense_prefill
            if dense.applies(q, kv_cache, metadata.fresh_prompt, sliding_window, softcap):
                found = dense.attend(q, k, v, scale, sliding_window, softcap)
                if found is not None:
                    return found
            out = torch.empty_like(q)
            paged_varlen_attention(
                q, kv_cache, metadata, scale, out, sliding_window=sliding_window, softcap=softcap,
                k_scale=k_scale, v_scale=v_scale, num_sms=self.num_sms(q.device),
            )
        return out

    def forward_rows(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
        metadata: AttentionMetadata, rows: OutputRows, scale: float, sliding_window: int = 0,
        softcap: float = 0.0, k_scale: float = 1.0, v_scale: float = 1.0,
        rope: QKRope | None = None,
    ) -> torch.Tensor:
        """A prefill pass of which only ``rows`` attend (the last layer of a step that samples
        them): every token's K/V to the cache as ``forward`` stores them, then the rows' queries
        through the decode kernel over their sequences, ``[R, num_heads, head_dim]``."""
        _check_groups(q, kv_cache)
        q, _ = self._rope_and_store(q, k, v, kv_cache, metadata, k_scale, v_scale, rope)
        q_rows = q.index_select(0, rows.index)
        out = torch.empty_like(q_rows)
        paged_decode_attention(
            q_rows, kv_cache, rows.metadata, scale, out, self.num_sms(q.device),
            sliding_window=sliding_window, softcap=softcap, k_scale=k_scale, v_scale=v_scale,
        )
        return out

    def _rope_and_store(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
        metadata: AttentionMetadata, k_scale: float, v_scale: float, rope: QKRope | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A prefill pass's q and k normed and rotated, and its K/V in the cache: one launch
        for both where it can (not into an FP8 cache), else each on its own."""
        stored = False
        if rope is not None:
            if not self.fuse_rope or kv_cache.dtype == torch.float8_e4m3fn:
                q, k = rope.apply(q, k)
            else:  # the rope launch also writes this pass's K/V to the cache
                store = KVStore(v, kv_cache, metadata.slot_mapping)
                q, k = qk_norm_rope_triton(q, k, rope.positions, rope.cos_sin, rope.q_weight,
                                           rope.k_weight, rope.eps, store)
                stored = True
        if not stored:
            store_kv_cache(k, v, kv_cache, metadata.slot_mapping, k_scale, v_scale)
        return _last_dim_contiguous(q), k


def _check_groups(q: torch.Tensor, kv_cache: torch.Tensor) -> None:
    num_heads, num_kv_heads = q.shape[1], kv_cache.shape[3]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not group over {num_kv_heads} kv heads")
