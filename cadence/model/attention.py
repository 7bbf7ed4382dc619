"""The plain-torch reference attention backend over the paged KV cache.

It loops over sequences on the host (reading the ``*_cpu`` copies of the metadata), so it is not
CUDA-graph capturable; faster backends are checked against it.
"""

from __future__ import annotations

import torch

from cadence.model.attention_metadata import AttentionMetadata, QKRope

_FP8 = torch.float8_e4m3fn
_FP8_MAX = 448.0


def _to_cache(x: torch.Tensor, cache_dtype: torch.dtype, scale: float) -> torch.Tensor:
    """``x`` as the cache stores it: e4m3 of ``x / scale`` (saturated), else the cache's dtype."""
    if cache_dtype != _FP8:
        return x.to(cache_dtype)
    return (x.float() / scale).clamp(-_FP8_MAX, _FP8_MAX).to(_FP8)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    # NOTE: index ops on float8 are missing on the CPU; bytes are moved instead.
    return t.view(torch.uint8) if t.dtype == _FP8 else t


def read_kv_cache(kv_cache: torch.Tensor, which: int, blocks: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """Keys (``which`` 0) or values (1) of ``blocks`` in float32, FP8 scales applied:
    ``[len(blocks), block_size, kv_heads, head_dim]``."""
    got = _bytes(kv_cache[which])[blocks]
    if kv_cache.dtype == _FP8:
        return got.view(_FP8).float() * scale
    return got.float()


def write_kv_cache(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: float = 1.0, v_scale: float = 1.0,
) -> None:
    """Store each token's key and value at its slot; tokens with a negative slot are skipped.
    An FP8 cache holds ``k / k_scale`` and ``v / v_scale``."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    key_cache = _bytes(kv_cache[0]).view(-1, num_kv_heads, head_dim)
    value_cache = _bytes(kv_cache[1]).view(-1, num_kv_heads, head_dim)
    slots = slot_mapping[: k.shape[0]]
    keep = slots >= 0
    if not bool(keep.all()):
        slots, k, v = slots[keep], k[keep], v[keep]
    key_cache.index_copy_(0, slots, _bytes(_to_cache(k, kv_cache.dtype, k_scale)))
    value_cache.index_copy_(0, slots, _bytes(_to_cache(v, kv_cache.dtype, v_scale)))


class TorchAttentionBackend:
    """Causal grouped-query attention, one batched matmul pair per sequence, softmax in float32."""

    name = "torch"

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
        """``sliding_window`` W > 0: a query at position p sees keys at positions p - W + 1 ... p.
        ``softcap`` c > 0: scaled scores s become ``c * tanh(s / c)`` before the softmax.
        ``k_scale`` / ``v_scale``: an FP8 cache's dequantization scales. ``rope``: the q/k norms
        and RoPE, applied first. ``qkv_releases_early`` (a launch-order hint) means nothing
        here."""
        if rope is not None:
            q, k = rope.apply(q, k)
        write_kv_cache(k, v, kv_cache, metadata.slot_mapping, k_scale, v_scale)
        num_tokens, num_heads, head_dim = q.shape
        block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
        group = num_heads // num_kv_heads
        out = torch.zeros_like(q)

        starts = _host_list(metadata.query_start_loc_cpu, metadata.query_start_loc)
        seq_lens = _host_list(metadata.seq_lens_cpu, metadata.seq_lens)
        for i, seq_len in enumerate(seq_lens):
            start, end = starts[i], starts[i + 1]
            query_len = end - start
            if query_len == 0 or seq_len == 0:
                continue
            num_blocks = -(-seq_len // block_size)
            blocks = metadata.block_tables[i, :num_blocks].long()
            # [num_blocks, block_size, kv_heads, d] -> [kv_heads, seq_len, d]
            keys = read_kv_cache(kv_cache, 0, blocks, k_scale)
            values = read_kv_cache(kv_cache, 1, blocks, v_scale)
            keys = keys.reshape(-1, num_kv_heads, head_dim)[:seq_len].transpose(0, 1)
            values = values.reshape(-1, num_kv_heads, head_dim)[:seq_len].transpose(0, 1)
            # Query heads h*group ... h*group+group-1 share kv head h: [kv_heads, group*q_len, d].
            queries = (
                q[start:end]
                .view(query_len, num_kv_heads, group, head_dim)
                .permute(1, 2, 0, 3)
                .reshape(num_kv_heads, group * query_len, head_dim)
                .float()
            )
            scores = torch.bmm(queries, keys.transpose(1, 2)) * scale
            if softcap > 0:
                scores = torch.tanh(scores / softcap) * softcap
            q_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)
            k_pos = torch.arange(seq_len, device=q.device)
            hidden = k_pos[None, :] > q_pos[:, None]
            if sliding_window > 0:
                hidden |= k_pos[None, :] <= q_pos[:, None] - sliding_window
            scores.masked_fill_(hidden.repeat(group, 1), float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            attended = torch.bmm(probs, values)  # [kv_heads, group*q_len, d]
            out[start:end] = (
                attended.view(num_kv_heads, group, query_len, head_dim)
                .permute(2, 0, 1, 3)
                .reshape(query_len, num_heads, head_dim)
                .to(q.dtype)
            )
        return out


def _host_list(host: torch.Tensor | None, device_tensor: torch.Tensor) -> list[int]:
    return (host if host is not None else device_tensor.cpu()).tolist()
