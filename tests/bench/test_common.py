"""Bytes a decode step reads, against sums written out from the published model shapes."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from cadence.bench.common import (
    MAX_WORKLOAD_TOKENS,
    fit_context,
    kv_bytes_per_token,
    weight_bytes,
    workload_problem,
)
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


def test_weight_bytes_of_a_mixture_of_experts_counts_the_experts_its_tokens_reach():
    # Qwen3-30B-A3B: hidden 2048, 32 query heads and 4 KV heads of 128, 48 layers, each a
    # router over 128 experts of 768 channels, 8 per token; vocabulary 151936, untied. Per layer:
    #   q 2048*4096 + k, v 2 * 2048*512 + o 4096*2048            = 18_874_368
    #   q/k norms 2 * 128 + two RMSNorms 2 * 2048 + router 2048*128 =    266_496
    #   experts 128 * 3 * 2048*768                                = 603_979_776
    # One token reaches 8 of 128 experts (1/16 of the expert bytes); 32 tokens spread evenly
    # miss an expert with probability (120/128)^32.
    model = _meta_model("qwen3-30b-a3b")
    dense = 48 * (18_874_368 + 266_496) + 151936 * 2048 + 2048  # + lm_head, final norm
    experts = 48 * 603_979_776
    assert weight_bytes(model) == 2 * (dense + experts // 16)
    want = 2 * (dense + experts * (1 - (120 / 128) ** 32))
    assert abs(weight_bytes(model, 32) - want) <= 2
    assert weight_bytes(model, 100_000) == 2 * (dense + experts)


def test_kv_bytes_per_token_counts_keys_and_values_of_every_layer():
    # Llama-3-8B: 32 layers, 8 KV heads of 128; a key and a value per head and layer, bf16:
    # 2 * 32 * 8 * 128 * 2 = 131_072 bytes (its published 128 KiB a token); fp8: half that.
    model = _meta_model("llama3-8b")
    assert kv_bytes_per_token(model, 2) == 131_072
    assert kv_bytes_per_token(model, 1) == 65_536


def test_a_workload_of_exactly_the_limit_is_built():
    assert MAX_WORKLOAD_TOKENS == 100_000_000
    assert workload_problem(1000, 100_000) is None
    assert workload_problem(100_000_000, 1) is None
    problem = workload_problem(1000, 100_001)
    assert problem is not None and "--num-prompts 1000 x --input-len 100001" in problem


def test_fit_context_takes_a_context_of_exactly_what_is_needed():
    """--max-model-len equal to the timed requests' length fits; without it the context is the
    length needed and 16 tokens more, at most the model's own (which may be exactly enough)."""
    given = SimpleNamespace(max_model_len=72)
    assert fit_context(given, 72, "--input-len + --output-len") is None
    assert given.max_model_len == 72
    below = fit_context(SimpleNamespace(max_model_len=71), 72, "--input-len + --output-len")
    assert below is not None and "--max-model-len 71 is below" in below
    for needed, want in ((100, 116), (2040, 2048), (2048, 2048)):
        args = SimpleNamespace(max_model_len=None)
        assert fit_context(args, needed, "the longest --input-lens", limit=2048) is None
        assert args.max_model_len == want
    args = SimpleNamespace(max_model_len=None)
    problem = fit_context(args, 2049, "the longest --input-lens", limit=2048)
    assert problem == "the longest --input-lens (2049) is more than the model's context (2048 tokens)"
    assert args.max_model_len is None
