from __future__ import annotations

import torch

from cadence.bench.common import weight_bytes
from cadence.model.attention import TorchAttentionBackend
from cadence.model.decoder import CausalLM
from cadence.model.registry import resolve_model


def _meta_model(name: str) -> CausalLM:
    with torch.device("meta"):
        return CausalLM(resolve_model(name).hf_config, TorchAttentionBackend()).to(torch.bfloat16)


def test_weight_bytes_counts_a_tied_output_head():
    # Qwen3-0.6B ties its embeddings: the output head reads the whole 151936 x 1024 table.
    model = _meta_model("qwen3-0.6b")
    assert model.lm_head is None
    total = sum(p.numel() for p in model.parameters()) * 2
    assert weight_bytes(model) == total
    assert 1.18e9 < total < 1.21e9


def test_weight_bytes_skips_an_untied_input_table():
    model = _meta_model("llama3-8b")
    assert model.lm_head is not None
    embed = model.model.embed_tokens.weight
    total = sum(p.numel() for p in model.parameters()) * 2
    assert weight_bytes(model) == total - embed.numel() * 2
