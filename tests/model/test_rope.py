"""RoPE parameters and frequencies against transformers' own initialisation functions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from cadence.model.rope import RopeParams, RotaryEmbedding, apply_rotary, inverse_frequencies
from tests.hf_models import LLAMA3_ROPE_SCALING


def _llama(**kwargs: object) -> transformers.LlamaConfig:
    base = dict(hidden_size=256, num_attention_heads=4, max_position_embeddings=512)
    if kwargs.get("rope_scaling"):  # transformers writes rope_theta into the dict it is given
        kwargs["rope_scaling"] = dict(kwargs["rope_scaling"])
    return transformers.LlamaConfig(**base, **kwargs)


@pytest.mark.parametrize(
    "scaling", [None, {"rope_type": "linear", "factor": 4.0}, LLAMA3_ROPE_SCALING], ids=str
)
def test_inverse_frequencies_match_transformers(scaling):
    config = _llama(rope_theta=50000.0, rope_scaling=scaling)
    params = RopeParams.from_hf_config(config)
    ours = inverse_frequencies(params, 64)
    if scaling is None:
        expected = 1.0 / (50000.0 ** (torch.arange(0, 64, 2).float() / 64))
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, torch.device("cpu"))
    torch.testing.assert_close(ours, expected, atol=0, rtol=1e-6)


def test_llama3_scaling_touches_all_three_bands():
    params = RopeParams.from_hf_config(_llama(rope_theta=10000.0, rope_scaling=LLAMA3_ROPE_SCALING))
    plain = inverse_frequencies(RopeParams(theta=10000.0), 64)
    scaled = inverse_frequencies(params, 64)
    ratio = plain / scaled
    assert ratio[0] == 1.0 and ratio[-1] == pytest.approx(8.0)
    assert ((ratio > 1.0) & (ratio < 8.0 - 1e-4)).any()


def test_old_style_config_fields_are_read():
    # The layout of configs written by transformers 4.x (read here without transformers' upgrade).
    config = SimpleNamespace(
        rope_theta=1234.0,
        rope_scaling={"type": "linear", "factor": 2.0},
        max_position_embeddings=100,
    )
    params = RopeParams.from_hf_config(config)
    assert (params.theta, params.rope_type, params.factor) == (1234.0, "linear", 2.0)
    assert RopeParams.from_hf_config(SimpleNamespace(max_position_embeddings=10)).theta == 10000.0


def test_new_style_rope_parameters_are_read():
    config = transformers.Qwen3Config(rope_theta=1e6)
    assert "rope_theta" in config.rope_parameters
    assert RopeParams.from_hf_config(config) == RopeParams(
        theta=1e6, original_max_position_embeddings=config.max_position_embeddings
    )


def test_unsupported_rope_type_is_named():
    config = SimpleNamespace(
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4},
        max_position_embeddings=100,
    )
    with pytest.raises(ValueError, match="yarn"):
        RopeParams.from_hf_config(config)


def test_rotation_matches_transformers_apply_rotary():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = _llama(rope_theta=500000.0, rope_scaling=LLAMA3_ROPE_SCALING)
    rope = RotaryEmbedding(RopeParams.from_hf_config(config), 64, 512)
    positions = torch.tensor([0, 5, 63, 300, 511])
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(5, 4, 64, generator=gen)
    k = torch.randn(5, 2, 64, generator=gen)
    cos, sin = rope.lookup(positions)
    hf_cos, hf_sin = LlamaRotaryEmbedding(config)(q, positions[None])
    # transformers wants [batch, heads, seq, dim].
    hq, hk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], hf_cos, hf_sin)
    torch.testing.assert_close(apply_rotary(q, cos, sin), hq[0].transpose(0, 1))
    torch.testing.assert_close(apply_rotary(k, cos, sin), hk[0].transpose(0, 1))
