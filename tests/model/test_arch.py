"""DecoderArch read from HF configs: which layers are sparse, what is refused, which biases
exist; checked against the modules transformers builds from the same configs."""

from __future__ import annotations

import pytest
import torch
import transformers

from cadence.model.arch import DecoderArch
from tests.model.helpers import hf_config


def _moe_config(**fields: object) -> transformers.Qwen3MoeConfig:
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=16, mlp_only_layers=[],
                architectures=["Qwen3MoeForCausalLM"])
    return transformers.Qwen3MoeConfig(**{**base, **fields})


@pytest.mark.parametrize(("step", "dense"), [(1, []), (2, []), (3, []), (2, [3])])
def test_sparse_layers_are_those_transformers_builds(step: int, dense: list[int]) -> None:
    config = _moe_config(decoder_sparse_step=step, mlp_only_layers=dense)
    with torch.device("meta"):
        hf = transformers.Qwen3MoeForCausalLM(config)
    theirs = tuple(hasattr(layer.mlp, "experts") for layer in hf.model.layers)
    assert DecoderArch.from_hf_config(config).moe_layers == theirs
    assert step == 1 or (any(theirs) and not all(theirs))  # the case tells the rules apart


def test_every_expert_per_token_is_allowed_and_more_is_refused() -> None:
    arch = DecoderArch.from_hf_config(_moe_config(num_experts_per_tok=4))
    assert (arch.num_experts, arch.num_experts_per_tok) == (4, 4)
    with pytest.raises(ValueError, match=r"num_experts_per_tok \(5\)"):
        DecoderArch.from_hf_config(_moe_config(num_experts_per_tok=5))
    with pytest.raises(ValueError, match=r"num_experts_per_tok \(0\)"):
        DecoderArch.from_hf_config(_moe_config(num_experts_per_tok=0))


def test_heads_must_be_a_multiple_of_kv_heads() -> None:
    config = hf_config("llama", tie=False)
    config.num_key_value_heads = 3
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\).*num_key_value_heads \(3\)"):
        DecoderArch.from_hf_config(config)


def test_qwen2_biases_are_those_transformers_builds() -> None:
    """Qwen2 has q/k/v biases and no o_proj bias, whatever attention_bias a config carries."""
    config = hf_config("qwen2", tie=False)
    config.attention_bias = True
    with torch.device("meta"):
        attn = transformers.Qwen2ForCausalLM(config).model.layers[0].self_attn
    arch = DecoderArch.from_hf_config(config)
    assert arch.qkv_bias == (attn.q_proj.bias is not None) is True
    assert arch.o_bias == (attn.o_proj.bias is not None) is False


def test_phi3_window_applies_to_every_layer() -> None:
    config = hf_config("phi3", tie=False)
    arch = DecoderArch.from_hf_config(config)
    assert arch.sliding_window == config.sliding_window > 0
    assert [arch.window(i) for i in range(arch.num_layers)] == [config.sliding_window] * 2


@pytest.mark.parametrize(("field", "value"), [("vocab_size", -5), ("head_dim", -32),
                                              ("num_key_value_heads", 0),
                                              ("hidden_size", 0)])
def test_sizes_that_are_not_positive_are_named(field: str, value: int) -> None:
    """A config.json with a size that is not a positive integer is one error naming the field
    (not a negative tensor dimension or a modulo by zero deep in the build)."""
    config = hf_config("llama", tie=False)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=f"config.json: {field} must be a positive integer"):
        DecoderArch.from_hf_config(config)
