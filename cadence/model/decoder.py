"""One decoder-only transformer for the Llama, Mistral, Phi-3, Qwen2, Qwen3 and Gemma families.

Construction allocates parameters on the current default device (use ``with torch.device(...)``);
``build_model`` in :mod:`cadence.model.loader` builds on the meta device and materializes the
weights directly on the target device and dtype. The forward pass has no host synchronization and
no data-dependent Python control flow, so it can be captured in a CUDA graph, provided the
attention backend itself is capturable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from cadence.model.arch import DecoderArch
from cadence.model.attention_layer import SelfAttention
from cadence.model.attention_metadata import AttentionBackend, AttentionMetadata, OutputRows
from cadence.model.bulk_mma import mma_listed
from cadence.model.embedding import embed
from cadence.model.gemma import GemmaDecoderLayer
from cadence.model.layers import GemmaRMSNorm, RMSNorm, silu_and_mul
from cadence.model.mlp_block import block_applies, mlp_block
from cadence.model.moe import SparseMoE
from cadence.model.parallel import TPShard, VocabParallelEmbedding, all_reduce, gather_vocab
from cadence.model.rope import (
    RopeParams,
    RotaryEmbedding,
    context_length,
    longrope_rows,
    rotary_permutation,
)
from cadence.model.skinny_gemm import SkinnyLinear, bulk_takes_mlp, use_skinny_gemm
from cadence.model.split_k import KParts, split_k_linear, weight_parts


def _plain_linear(module: nn.Module) -> bool:
    """An ``nn.Linear`` (or its skinny form) without bias: no quantized or sharded projection."""
    return type(module) in (nn.Linear, SkinnyLinear) and module.bias is None


def _split_parts(weight: torch.Tensor, rows: int, dtype: torch.dtype,
                 modes: tuple[str, ...] = ("plain",)) -> int:
    """``weight_parts``, except where the bulk GEMM's table lists the projection in one of the
    ``modes`` it may run in: that kernel lets the next launch start early, which the batched
    product does not (docs/perf.md, run VA)."""
    parts = weight_parts(weight, rows, dtype)
    return 0 if parts and any(mma_listed(weight, m, rows) for m in modes) else parts


class MLP(nn.Module):
    def __init__(self, arch: DecoderArch) -> None:
        super().__init__()
        # Rows: [gate | up].
        self.gate_up_proj = nn.Linear(
            arch.hidden_size, 2 * arch.intermediate_size, bias=arch.mlp_bias
        )
        self.down_proj = nn.Linear(arch.intermediate_size, arch.hidden_size, bias=arch.mlp_bias)
        self.tp = arch.tp_size > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.gate_up_proj(x))

    def down(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SwiGLU and the down projection (all-reduced under tensor parallelism)."""
        forward_glu = getattr(self.down_proj, "forward_glu", None)  # SkinnyLinear, Fp8Linear
        if forward_glu is not None:  # SwiGLU in the projection's loads, for few rows
            out = forward_glu(gate_up)
        else:
            out = self.down_proj(silu_and_mul(gate_up))
        return all_reduce(out) if self.tp else out


class DecoderLayer(nn.Module):
    local_rope = False  # every layer rotates with the one rope table
    takes_rows = True  # ``forward`` may run past the qkv projection for ``rows`` only

    def __init__(self, arch: DecoderArch, backend: AttentionBackend, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = SelfAttention(arch, backend, layer)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp: nn.Module = SparseMoE(arch) if arch.is_moe_layer(layer) else MLP(arch)
        # The one-launch block for one-token steps (model/mlp_block.py): a dense MLP and no
        # all-reduce between its projections (``_block`` checks the projections themselves).
        self.block_ok = isinstance(self.mlp, MLP) and arch.tp_size == 1
        # K-split o and down projections (model/split_k.py): no all-reduce after them.
        self.split_ok = arch.tp_size == 1

    def forward(
        self,
        x: torch.Tensor | KParts,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: torch.Tensor,
        attn: AttentionMetadata,
        rows: OutputRows | None = None,
    ) -> tuple[torch.Tensor | KParts, torch.Tensor]:
        """``x`` is the previous layer's MLP output (or its K-split partial sums), added to
        ``residual`` here (the first layer gets the embeddings and no residual). Returns this
        layer's MLP output and residual; with ``rows`` (the last layer), every token's K/V is
        stored and the two are ``rows``' only.
        Each norm hands its input to the projection that takes its output (``RMSNorm.project``),
        which for few rows runs it in its loads."""
        qkv, residual = self.input_layernorm.project(self.self_attn.qkv_proj, x, residual)
        if rows is not None:
            # NOTE: before attention, so that its launch still releases o_proj's (PDL).
            residual = residual.index_select(0, rows.index)
        elif self.block_ok and qkv.shape[0] == 1 and not self._bulk_mlp():
            fused = self._block(qkv, residual, positions, cos_sin, kv_cache, attn)
            if fused is not None:
                return fused
        h = self._attend(qkv, positions, cos_sin, kv_cache, attn, rows)
        if isinstance(self.mlp, MLP):
            gate_up, residual = self.post_attention_layernorm.project(
                self.mlp.gate_up_proj, h, residual
            )
            return self._down(gate_up), residual
        h, residual = self.post_attention_layernorm.add_and_norm(h, residual)
        return self.mlp(h), residual

    def _attend(
        self, qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
        kv_cache: torch.Tensor, attn: AttentionMetadata, rows: OutputRows | None = None,
    ) -> torch.Tensor | KParts:
        """Attention and o_proj (of ``rows`` only, given them); for the row counts ``split_k``
        lists, o_proj's K-split partial sums, which the post-attention norm adds up."""
        sa = self.self_attn
        if self.split_ok and _plain_linear(sa.o_proj):
            count = qkv.shape[0] if rows is None else rows.count
            parts = _split_parts(sa.o_proj.weight, count, qkv.dtype)
            if parts:
                heads = sa.attend_heads(qkv, positions, cos_sin, kv_cache, attn, rows)
                return split_k_linear(heads, sa.o_proj.weight, parts)
        return sa.attend(qkv, positions, cos_sin, kv_cache, attn, rows)

    def _down(self, gate_up: torch.Tensor) -> torch.Tensor | KParts:
        """SwiGLU and down_proj; K-split partial sums where ``split_k`` lists the row count (the
        next layer's input norm, or the final one, adds them up)."""
        down = self.mlp.down_proj
        if self.split_ok and _plain_linear(down):
            parts = _split_parts(down.weight, gate_up.shape[0], gate_up.dtype, ("plain", "glu"))
            if parts:
                return split_k_linear(silu_and_mul(gate_up), down.weight, parts)
        return self.mlp.down(gate_up)

    def _bulk_mlp(self) -> bool:
        """One-token steps take the bulk-copy GEMVs instead of the MLP block (see
        ``skinny_gemm.bulk_takes_mlp``)."""
        return bulk_takes_mlp(self.self_attn.o_proj, self.mlp.gate_up_proj, self.mlp.down_proj)

    def _block(
        self, qkv: torch.Tensor, residual: torch.Tensor, positions: torch.Tensor,
        cos_sin: torch.Tensor, kv_cache: torch.Tensor, attn: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``forward`` after the qkv projection in one launch after attention (one token); None
        where the block does not apply, before anything ran."""
        sa, mlp, norm = self.self_attn, self.mlp, self.post_attention_layernorm
        if not (_plain_linear(sa.o_proj) and _plain_linear(mlp.gate_up_proj)
                and _plain_linear(mlp.down_proj)):
            return None
        o_w, gu_w, d_w = sa.o_proj.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight
        rows = residual.reshape(1, -1)
        if not block_applies(qkv.shape[0], qkv.dtype, qkv.device, rows, o_w, norm.weight, gu_w,
                             d_w):
            return None
        a = sa.attend_heads(qkv, positions, cos_sin, kv_cache, attn).contiguous()
        fused = mlp_block(a, rows, o_w, norm.weight, norm.eps, gu_w, d_w)
        if fused is None:  # the launch could not run: the unfused kernels from the heads on
            h = sa.o_proj(a)
            gate_up, residual = norm.project(mlp.gate_up_proj, h, residual)
            return mlp.down(gate_up), residual
        out, new_residual = fused
        return out, new_residual.view(residual.shape)


# Families whose attention rotates part of a head when the config says so (transformers').
PARTIAL_ROTARY = ("Phi3ForCausalLM",)


class DecoderModel(nn.Module):
    def __init__(self, arch: DecoderArch, backend: AttentionBackend,
                 shard: TPShard | None = None) -> None:
        super().__init__()
        self.embed_tokens: nn.Module = (
            nn.Embedding(arch.vocab_size, arch.hidden_size) if shard is None
            else VocabParallelEmbedding(shard, arch.hidden_size)
        )
        layers: list[nn.Module]
        if arch.gemma:
            layers = [GemmaDecoderLayer(arch, backend, i) for i in range(arch.num_layers)]
            self.norm: nn.Module = GemmaRMSNorm(arch.hidden_size, arch.rms_norm_eps)
        else:
            layers = [DecoderLayer(arch, backend, i) for i in range(arch.num_layers)]
            self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.layers = nn.ModuleList(layers)


class CausalLM(nn.Module):
    """``hidden = model(input_ids [T], positions [T], attn)``; ``compute_logits(hidden_rows)``.

    Parameter names follow the HF checkpoints' (``model.layers.N.self_attn...``) except for the
    fused ``qkv_proj`` and ``gate_up_proj``. With tied embeddings there is no ``lm_head``.
    With a ``shard`` (tensor parallelism) the layers hold one rank's part and ``arch`` has that
    rank's shapes (see :mod:`cadence.model.parallel`).
    """

    def __init__(self, hf_config: PretrainedConfig, attn_backend: AttentionBackend,
                 tp_rank: int = 0, tp_size: int = 1) -> None:
        super().__init__()
        full = DecoderArch.from_hf_config(hf_config)
        self.shard = TPShard.of(full, tp_rank, tp_size) if tp_size > 1 else None
        self.arch = full if self.shard is None else self.shard.local_arch(full)
        self.attn_backend = attn_backend
        self.model = DecoderModel(self.arch, attn_backend, self.shard)
        use_skinny_gemm(self.model)  # projections of few rows: a split-K kernel on CUDA
        head_rows = self.arch.vocab_size if self.shard is None else self.shard.vocab_per_rank
        self.lm_head = (
            None
            if self.arch.tie_word_embeddings
            else nn.Linear(self.arch.hidden_size, head_rows, bias=False)
        )
        rows = context_length(hf_config)
        rope = RopeParams.from_hf_config(hf_config)
        if rope.partial_rotary_factor != 1.0 and self.arch.architecture not in PARTIAL_ROTARY:
            # transformers rotates part of a head only in these families' attention.
            raise ValueError(f"partial_rotary_factor != 1 is supported for "
                             f"{', '.join(PARTIAL_ROTARY)} only, not {self.arch.architecture}.")
        self.rotary_emb = RotaryEmbedding(rope, self.arch.head_dim, rows)
        # Gemma 3: the sliding layers' table (their own rope base).
        self.rotary_emb_local = (
            RotaryEmbedding(
                RopeParams.from_hf_config(hf_config, "sliding_attention"),
                self.arch.head_dim,
                rows,
            )
            if self.arch.local_rope
            else None
        )
        self._kv_caches: list[torch.Tensor] = []

    @torch.no_grad()
    def order_rotary_dims(self) -> None:
        """Partial rotation (``cadence.model.rope``): permute each head's q and k rows (and
        biases, and q/k norm weights) as the rope table wants them; once, after the checkpoint's
        weights are in (and before any quantization)."""
        rotary = self.rotary_emb.rotary_dim
        head_dim = self.arch.head_dim
        if rotary == head_dim:
            return
        perm = rotary_permutation(head_dim, rotary)
        for layer in self.model.layers:
            layer.self_attn.permute_qk_dims(perm)

    @property
    def num_layers(self) -> int:
        return self.arch.num_layers

    @property
    def num_kv_heads(self) -> int:
        return self.arch.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.arch.head_dim

    @property
    def vocab_size(self) -> int:
        return self.arch.vocab_size

    def dense_prefill_min_tokens(self, dtype: torch.dtype, cache_dtype: torch.dtype,
                                 device: torch.device) -> int | None:
        """The fewest tokens of a lone prompt from position 0 from which every layer's backend
        attends densely (``AttentionMetadata.fresh_prompt``); None where some layer never does.

        Every layer or none: a dense layer reads the K/V of a graph bucket's padding rows (a
        causal mask zeroes their weights, and 0 x NaN is NaN), which a varlen layer would leave
        unwritten in its output."""
        find = getattr(self.attn_backend, "dense_prefill_min_tokens", None)
        if find is None:
            return None
        arch = self.arch
        found = {find(dtype, arch.num_heads, arch.num_kv_heads, arch.head_dim, cache_dtype,
                      arch.window(i), arch.attn_softcap, device) for i in range(arch.num_layers)}
        return None if None in found else min(found)

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int, int]:
        """The shape of one layer's cache: ``[2, num_blocks, block_size, kv_heads, head_dim]``."""
        return (2, num_blocks, block_size, self.arch.num_kv_heads, self.arch.head_dim)

    def kv_cache_bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        """Bytes one block takes over all layers (for sizing the cache from free memory)."""
        per_layer = 2 * block_size * self.arch.num_kv_heads * self.arch.head_dim
        return per_layer * self.arch.num_layers * torch.empty((), dtype=dtype).element_size()

    def bind_kv_caches(self, kv_caches: list[torch.Tensor]) -> None:
        if len(kv_caches) != self.num_layers:
            raise ValueError(f"expected {self.num_layers} KV caches, got {len(kv_caches)}.")
        for i, cache in enumerate(kv_caches):
            if (
                cache.dim() != 5
                or cache.shape[0] != 2
                or tuple(cache.shape[3:])
                != (
                    self.num_kv_heads,
                    self.head_dim,
                )
            ):
                raise ValueError(
                    f"KV cache {i} has shape {tuple(cache.shape)}; expected "
                    f"{self.kv_cache_shape(-1, -1)} with any num_blocks and block_size."
                )
        self._kv_caches = list(kv_caches)

    @torch.no_grad()
    def reset_buffers(self) -> None:
        """Recompute non-persistent buffers (needed after ``to_empty``)."""
        self.rotary_emb.reset_table()
        if self.rotary_emb_local is not None:
            self.rotary_emb_local.reset_table()
        for module in self.modules():
            if isinstance(module, SparseMoE):
                module.reset_buffers()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
        rows: OutputRows | None = None,
    ) -> torch.Tensor:
        """The final hidden states ``[T, hidden]``; with ``rows``, ``rows``' only ``[R, hidden]``
        (the last layer attends and runs its MLP for those tokens alone)."""
        if not self._kv_caches:
            raise RuntimeError("bind_kv_caches() must be called before the first forward.")
        cos_sin = self.rotary_emb.cos_sin
        if self.rotary_emb.long_offset:
            positions = longrope_rows(positions, attn.query_start_loc, attn.seq_lens,
                                      self.rotary_emb.params.original_max_position_embeddings,
                                      self.rotary_emb.long_offset)
        local = cos_sin if self.rotary_emb_local is None else self.rotary_emb_local.cos_sin
        x = embed(self.model.embed_tokens, input_ids)
        if self.arch.gemma:
            # transformers rounds the float32 scale to the weights' dtype first.
            scale = torch.tensor(self.arch.hidden_size**0.5, dtype=torch.float32).to(x.dtype)
            x = x * float(scale)
        residual: torch.Tensor | None = None
        last = self.model.layers[-1]
        in_layer = rows if rows is not None and getattr(last, "takes_rows", False) else None
        for layer, kv_cache in zip(self.model.layers, self._kv_caches, strict=True):
            table = local if layer.local_rope else cos_sin
            if layer is last and in_layer is not None:
                x, residual = layer(x, residual, positions, table, kv_cache, attn, in_layer)
            else:
                x, residual = layer(x, residual, positions, table, kv_cache, attn)
        if residual is None:
            hidden = self.model.norm(x)
        else:
            hidden = self.model.norm.add_and_norm(x, residual)[0]
        if rows is not None and in_layer is None:  # a layer that runs every token: keep rows
            hidden = hidden.index_select(0, rows.index)
        return hidden

    def compute_logits(self, hidden_rows: torch.Tensor, as_float: bool = True) -> torch.Tensor:
        """``[N, hidden] -> [N, vocab]`` float32 logits; with ``as_float=False`` in the model's
        dtype where nothing follows the product (no final soft cap): the sampler works on a
        float32 copy anyway, and a greedy argmax needs none."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(hidden_rows, weight)
        if self.shard is not None:
            logits = gather_vocab(logits, self.shard, self.arch.vocab_size)
        if not as_float and not self.arch.final_softcap:
            return logits
        logits = logits.float()
        if self.arch.final_softcap:
            cap = self.arch.final_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits
