"""Bytes a decode step reads, against sums written out from the published model shapes."""

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
    # Qwen3-0.6B: hidden 1024, 16 query heads and 8 KV heads of 128, MLP 3072, 28 layers,
    # vocabulary 151936, embeddings tied. Per layer:
    #   q 1024*2048 + k 1024*1024 + v 1024*1024 + o 2048*1024   = 6_291_456
    #   gate, up 2 * 1024*3072 + down 3072*1024                 = 9_437_184
    #   q/k norms 2 * 128 + two RMSNorms 2 * 1024               =     2_304
    #                                                            = 15_730_944
    # 28 layers 440_466_432 + the table 151936*1024 = 155_582_464 + final norm 1024
    # = 596_049_920 parameters (Qwen's "0.6B", 0.44B of them outside the embeddings). The tied
    # output head reads the whole table, so every parameter counts: 2 bytes each in bf16.
    model = _meta_model("qwen3-0.6b")
    assert model.lm_head is None
    assert weight_bytes(model) == 1_192_099_840


def test_weight_bytes_skips_an_untied_input_table():
    # Llama-3-8B: hidden 4096, 32 query heads and 8 KV heads of 128, MLP 14336, 32 layers,
    # vocabulary 128256, untied. Per layer:
    #   q 4096*4096 + k 4096*1024 + v 4096*1024 + o 4096*4096   =  41_943_040
    #   gate, up, down 3 * 4096*14336                           = 176_160_768
    #   two RMSNorms 2 * 4096                                   =       8_192
    #                                                            = 218_112_000
    # 32 layers 6_979_584_000 + lm_head 128256*4096 = 525_336_576 + final norm 4096
    # = 7_504_924_672 parameters read per step (8_030_261_248 with the input table, which a
    # step only touches a few rows of); 2 bytes each in bf16.
    model = _meta_model("llama3-8b")
    assert model.lm_head is not None
    assert weight_bytes(model) == 15_009_849_344
