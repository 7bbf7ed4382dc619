"""Shared helpers for the model tests: tiny HF checkpoints and hand-built paged batches."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
import transformers

from cadence.model.attention import TorchAttentionBackend
from cadence.model.attention_metadata import AttentionMetadata, OutputRows
from cadence.model.decoder import CausalLM
from cadence.model.loader import build_model
from cadence.model.registry import resolve_model
from tests.hf_models import hf_config as shared_hf_config

VOCAB = 128
BLOCK_SIZE = 4
NUM_BLOCKS = 48
DUMMY_SLOT = 0  # block 0 is never handed to a sequence; padding tokens write here


def hf_config(family: str, tie: bool) -> transformers.PretrainedConfig:
    return shared_hf_config(
        family,
        tie,
        llama_rope_theta=10000.0,
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        eos_token_id=2,
    )


def make_hf_model(family: str, tie: bool, seed: int = 0) -> transformers.PreTrainedModel:
    """A float32 random HF model with weights large enough that mistakes show in the logits."""
    config = hf_config(family, tie)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.2 * noise)
            else:
                p.copy_(0.15 * noise)
    return model.eval()


def save_hf_model(model: transformers.PreTrainedModel, path: Path, **kwargs: object) -> Path:
    model.save_pretrained(path, **kwargs)
    return path


def load_ours(path: Path, dtype: torch.dtype = torch.float32) -> CausalLM:
    spec = resolve_model(str(path))
    model = build_model(spec, dtype, "cpu", "auto", TorchAttentionBackend(), seed=0)
    model.bind_kv_caches(new_kv_caches(model, dtype))
    return model


def new_kv_caches(model: CausalLM, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    shape = model.kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE)
    # NaN-filled: reading a slot that was never written poisons the result.
    return [torch.full(shape, float("nan"), dtype=dtype) for _ in range(model.num_layers)]


@torch.no_grad()
def hf_logits(model: transformers.PreTrainedModel, tokens: list[int]) -> torch.Tensor:
    return model(torch.tensor([tokens])).logits[0].float()


@dataclass
class Chunk:
    """One sequence's part of a forward pass: ``tokens`` at positions ``start, start + 1, ...``."""

    tokens: list[int]
    start: int
    block_table: list[int]


@dataclass
class Batch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata


def cuda_args(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """The forward pass's arguments on the GPU (the metadata's host copies stay on the host)."""
    md = batch.metadata
    metadata = replace(
        md,
        query_start_loc=md.query_start_loc.cuda(),
        seq_lens=md.seq_lens.cuda(),
        block_tables=md.block_tables.cuda(),
        slot_mapping=md.slot_mapping.cuda(),
    )
    return batch.input_ids.cuda(), batch.positions.cuda(), metadata


def make_batch(chunks: list[Chunk], num_padding_tokens: int = 0) -> Batch:
    """A flat batch as the model runner would build it; padding adds one empty sequence whose
    tokens write to the dummy slot (the CUDA-graph layout)."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts = [0]
    seq_lens: list[int] = []
    for chunk in chunks:
        for offset, token in enumerate(chunk.tokens):
            pos = chunk.start + offset
            ids.append(token)
            positions.append(pos)
            slots.append(chunk.block_table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
        starts.append(len(ids))
        seq_lens.append(chunk.start + len(chunk.tokens))
    num_actual = len(ids)
    tables = [c.block_table for c in chunks]
    if num_padding_tokens:
        ids += [0] * num_padding_tokens
        positions += [0] * num_padding_tokens
        slots += [DUMMY_SLOT] * num_padding_tokens
        starts.append(num_actual)  # the padding sequence has an empty query range
        seq_lens.append(0)
        tables.append([])
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    query_lens = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    query_start_loc = torch.tensor(starts, dtype=torch.int32)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    metadata = AttentionMetadata(
        num_actual_tokens=num_actual,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_start_loc=query_start_loc,
        seq_lens=seq_lens_t,
        block_tables=block_tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc_cpu=query_start_loc.clone(),
        seq_lens_cpu=seq_lens_t.clone(),
    )
    return Batch(torch.tensor(ids), torch.tensor(positions), metadata)


def last_rows(batch: Batch, num_seqs: int | None = None) -> OutputRows:
    """The last token of each of the batch's first ``num_seqs`` sequences (all real ones by
    default) as the model's ``rows``: their flat indices and their decode layout."""
    md = batch.metadata
    n = int((md.seq_lens > 0).sum()) if num_seqs is None else num_seqs
    index = (md.query_start_loc[1 : n + 1] - 1).to(torch.int32)
    decode = AttentionMetadata(
        num_actual_tokens=n,
        max_query_len=1,
        max_seq_len=md.max_seq_len,
        query_start_loc=torch.arange(n + 1, dtype=torch.int32),
        seq_lens=md.seq_lens[:n],
        block_tables=md.block_tables[:n],
        slot_mapping=md.slot_mapping[index.long()],
        query_start_loc_cpu=torch.arange(n + 1, dtype=torch.int32),
        seq_lens_cpu=md.seq_lens[:n].clone(),
    )
    return OutputRows(index, decode)


@torch.no_grad()
def run_ours(model: CausalLM, batch: Batch) -> torch.Tensor:
    hidden = model(batch.input_ids, batch.positions, batch.metadata)
    return model.compute_logits(hidden[: batch.metadata.num_actual_tokens])
