"""The model shape the trace's floors use: stored element sizes of weights and cache."""

from __future__ import annotations

import torch

from cadence.model.decoder import CausalLM
from cadence.model.fp8 import quantize_model_fp8
from cadence.trace.floors import ModelShape
from tests.model.helpers import hf_config


def _model() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(hf_config("qwen3", tie=False), attn_backend=None).to(torch.bfloat16)  # type: ignore[arg-type]


def _linear_elements(model: CausalLM) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, p in model.named_parameters():
        if p.dim() == 2 and "embed_tokens" not in name:
            layer = name.removesuffix(".weight").rsplit(".", 1)[-1]
            counts[layer] = counts.get(layer, 0) + p.numel()
    return counts


def test_bf16_weights_and_cache_count_two_bytes():
    model = _model()
    shape = ModelShape.from_model(model, 2)
    assert shape.linear_bytes == {} and shape.kv_dtype_bytes == 0
    assert shape.weight_bytes == 2 * sum(_linear_elements(model).values())
    per_token = 2 * model.num_kv_heads * model.head_dim * 2
    assert shape.kv_bytes(10) == 10 * per_token


def test_fp8_projections_and_cache_count_one_byte_and_survive_json():
    model = _model()
    elements = _linear_elements(model)
    assert quantize_model_fp8(model) == 4 * model.num_layers
    shape = ModelShape.from_model(model, 2, kv_dtype_bytes=1)
    projections = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    assert shape.linear_bytes == dict.fromkeys(projections, 1)
    want = sum(n * (1 if layer in projections else 2) for layer, n in elements.items())
    assert shape.weight_bytes == want
    assert shape.kv_bytes(10) == 10 * 2 * model.num_kv_heads * model.head_dim
    assert ModelShape.from_json(shape.to_json()) == shape
    old = {k: v for k, v in shape.to_json().items() if k not in ("linear_bytes", "kv_dtype_bytes")}
    assert ModelShape.from_json(old).kv_bytes(1) == 2 * model.num_kv_heads * model.head_dim * 2


def test_fp8_experts_scales_are_not_linears():
    torch.manual_seed(0)
    model = CausalLM(hf_config("qwen3-moe", tie=False), attn_backend=None)  # type: ignore[arg-type]
    quantize_model_fp8(model)
    shape = ModelShape.from_model(model, 4)
    assert not any(name.endswith("_scale") for name in shape.linears)
    assert "gate" in shape.linears  # the router stays a float32 linear
