"""The model shape the trace's floors use: stored element sizes of weights and cache."""

from __future__ import annotations

import pytest
import torch

from cadence.model.decoder import CausalLM
from cadence.model.fp8 import quantize_model_fp8
from cadence.trace.floors import ATTENTION, GEMM, ModelShape, default_bandwidth, floor_of
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


@pytest.mark.parametrize(("device", "bandwidth"), [
    ("NVIDIA H200", 4.8e12), ("NVIDIA H100 80GB HBM3", 3.35e12),
    ("NVIDIA A100-SXM4-80GB", 2.0e12), ("NVIDIA A10", 6.0e11), ("NVIDIA A10G", 6.0e11),
    ("NVIDIA L40S", 8.64e11), ("NVIDIA L4", 3.0e11), ("NVIDIA GeForce RTX 4090", None),
])
def test_spec_bandwidth_of_a_device_name(device: str, bandwidth: float | None) -> None:
    """The published read bandwidths: an A100 is not an A10 (2.0 TB/s against 600 GB/s), nor
    an L40S an L4 (864 GB/s against 300 GB/s), though one name holds the other."""
    assert default_bandwidth(device) == bandwidth


def test_a_linear_over_a_batch_of_sequences_counts_every_row() -> None:
    """aten::linear of a [2, 3, 64] input by a [192, 64] weight: M = 2 * 3 = 6 rows, bf16,
    with a bias of 192: 2 * (192*64 + 6*64 + 6*192 + 192) bytes."""
    shape = ModelShape(linears={"qkv_proj": [192, 64]}, linear_counts={"qkv_proj": 1})
    floor = floor_of("gemm", GEMM, "aten::linear", ((2, 3, 64), (192, 64), (192,)),
                     ("c10::BFloat16",) * 3, shape, None)
    assert floor.op == "gemm qkv_proj M=6 N=192 K=64"
    assert floor.bytes == 2 * (192 * 64 + 6 * 64 + 6 * 192 + 192)


def test_the_split_kv_merge_reads_no_kv_cache() -> None:
    """The merge of split-KV partials is an attention kernel that reads the partials, not the
    cache: no KV floor; the decode kernel reads keys and values of every context token."""
    shape = ModelShape(num_layers=2, num_kv_heads=2, head_dim=16)
    assert floor_of("_merge_splits_kernel", ATTENTION, None, (), (), shape, 100.0).bytes is None
    decode = floor_of("_decode_kernel", ATTENTION, None, (), (), shape, 100.0)
    assert decode.bytes == 2 * 2 * 16 * 2 * 100


@pytest.mark.parametrize("nk", [[0, 64], [64, 0], [64]])
def test_a_linear_of_no_elements_is_a_bad_shape(nk: list[int]) -> None:
    with pytest.raises(ValueError, match="bad linear"):
        ModelShape(linears={"o_proj": nk}, linear_counts={"o_proj": 1})
