"""RoPE parameters and frequencies against transformers' own initialisation functions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from cadence.model.rope import (
    RopeParams,
    RotaryEmbedding,
    apply_rotary,
    attention_scaling,
    inverse_frequencies,
    longrope_rows,
)
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
    n = config.max_position_embeddings
    assert RopeParams.from_hf_config(config) == RopeParams(
        theta=1e6, original_max_position_embeddings=n, max_position_embeddings=n
    )


def test_unsupported_rope_type_is_named():
    config = SimpleNamespace(
        rope_parameters={"rope_type": "mrope", "factor": 4.0, "rope_theta": 1e4},
        max_position_embeddings=100,
    )
    with pytest.raises(ValueError, match="mrope.*supported: default, linear, llama3, yarn"):
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


YARN_VARIANTS = [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
     "beta_fast": 16, "beta_slow": 2, "truncate": False},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
     "mscale": 0.707, "mscale_all_dim": 1.0},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256,
     "attention_factor": 1.5},
    # A long original length: the ramp's high end passes head_dim / 2 (clamped at head_dim - 1).
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 65536},
]  # fmt: skip


@pytest.mark.parametrize("scaling", YARN_VARIANTS, ids=str)
def test_yarn_matches_transformers(scaling):
    config = _llama(rope_theta=10000.0, rope_scaling=scaling)
    params = RopeParams.from_hf_config(config)
    expected, factor = ROPE_INIT_FUNCTIONS["yarn"](config, torch.device("cpu"))
    torch.testing.assert_close(inverse_frequencies(params, 64), expected, atol=0, rtol=1e-6)
    assert attention_scaling(params) == pytest.approx(factor, rel=1e-12)
    plain = inverse_frequencies(RopeParams(theta=10000.0), 64)
    assert not torch.allclose(expected, plain)  # the variant really scales


@pytest.mark.parametrize("seq_len", [None, 512, 700, 4096])
def test_dynamic_ntk_matches_transformers(seq_len):
    config = _llama(rope_theta=10000.0, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    params = RopeParams.from_hf_config(config)
    expected, factor = ROPE_INIT_FUNCTIONS["dynamic"](config, torch.device("cpu"), seq_len=seq_len)
    ours = inverse_frequencies(params, 64, seq_len=seq_len)
    torch.testing.assert_close(ours, expected, atol=0, rtol=1e-6)
    assert attention_scaling(params) == factor == 1.0
    # Up to max_position_embeddings (all an engine can reach) the base is not stretched.
    plain = inverse_frequencies(RopeParams(theta=10000.0), 64)
    assert torch.equal(ours, plain) == (seq_len is None or seq_len <= 512)


def _longrope_config(original: int = 128) -> transformers.PretrainedConfig:
    gen = torch.Generator().manual_seed(0)
    scaling = {
        "rope_type": "longrope",
        "short_factor": (1 + torch.rand(32, generator=gen)).tolist(),
        "long_factor": (1 + 4 * torch.rand(32, generator=gen)).tolist(),
        "original_max_position_embeddings": original,
    }
    return _llama(rope_theta=10000.0, rope_scaling=scaling)


@pytest.mark.parametrize("seq_len", [None, 128, 129, 512])
def test_longrope_matches_transformers(seq_len):
    config = _longrope_config()
    params = RopeParams.from_hf_config(config)
    assert params.factor == 4.0  # 512 / 128, derived as transformers does
    expected, factor = ROPE_INIT_FUNCTIONS["longrope"](config, torch.device("cpu"), seq_len=seq_len)
    long = seq_len is not None and seq_len > 128
    torch.testing.assert_close(
        inverse_frequencies(params, 64, long=long), expected, atol=0, rtol=1e-6
    )
    assert attention_scaling(params) == pytest.approx(factor, rel=1e-12) and factor > 1.0


def test_longrope_rows_switch_past_the_original_length_per_sequence():
    # transformers takes the long factors when its longest position + 1 exceeds the original
    # length (32 here): a sequence of exactly 32 tokens stays on the short rows.
    positions = torch.tensor([*range(32), 31, 32, 99, 0, 0])
    query_start_loc = torch.tensor([0, 32, 34, 35], dtype=torch.int32)
    seq_lens = torch.tensor([32, 33, 100], dtype=torch.int32)  # after this pass
    rows = longrope_rows(positions, query_start_loc, seq_lens, 32, 1000)
    # A prefill of 32 (short), a chunk that takes its sequence to 33 (long), a decode at 100
    # (long); the two padding tokens past the last sequence follow it.
    assert rows.tolist() == [*range(32), 1031, 1032, 1099, 1000, 1000]
    assert rows.dtype == positions.dtype


def test_longrope_needs_both_factor_lists():
    config = SimpleNamespace(
        rope_parameters={"rope_type": "longrope", "short_factor": [1.0], "rope_theta": 1e4},
        max_position_embeddings=100,
    )
    with pytest.raises(ValueError, match="long_factor"):
        RopeParams.from_hf_config(config)


@pytest.mark.parametrize(
    "scaling",
    [YARN_VARIANTS[0], YARN_VARIANTS[2], {"rope_type": "dynamic", "factor": 2.0}, "longrope"],
    ids=str,
)
def test_tables_match_transformers_cos_sin(scaling):
    """cos and sin rows (attention factor included) equal transformers' rotary embedding's;
    longrope's long rows equal what it uses for a forward longer than the original length."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = _longrope_config() if scaling == "longrope" else _llama(
        rope_theta=10000.0, rope_scaling=scaling
    )
    rope = RotaryEmbedding(RopeParams.from_hf_config(config), 64, 512)
    x = torch.zeros(1, 4, 64)
    short = torch.tensor([0, 5, 63, 127])
    cos, sin = rope.lookup(short)
    hf_cos, hf_sin = LlamaRotaryEmbedding(config)(x, short[None])
    torch.testing.assert_close(torch.cat([cos, cos], -1)[:, 0], hf_cos[0], atol=0, rtol=0)
    torch.testing.assert_close(torch.cat([sin, sin], -1)[:, 0], hf_sin[0], atol=0, rtol=0)
    if scaling == "longrope":
        assert rope.cos_sin.shape[0] == 1024 and rope.long_offset == 512
        longer = torch.tensor([0, 5, 200, 511])
        cos, sin = rope.lookup(longer + rope.long_offset)
        hf_cos, hf_sin = LlamaRotaryEmbedding(config)(x, longer[None])
        torch.testing.assert_close(torch.cat([cos, cos], -1)[:, 0], hf_cos[0], atol=0, rtol=0)
        torch.testing.assert_close(torch.cat([sin, sin], -1)[:, 0], hf_sin[0], atol=0, rtol=0)


@pytest.mark.parametrize("partial", [0.5, 0.75, 0.25])
def test_partial_rotation_through_the_permuted_table_is_phi3s(partial):
    """Phi-3's partial rotation (first R dimensions rotate, the rest pass through) equals the
    full-width table applied to the head's dimensions in ``rotary_permutation``'s order."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb

    from cadence.model.rope import rotary_permutation

    config = transformers.Phi3Config(hidden_size=256, num_attention_heads=4,
                                     max_position_embeddings=512, partial_rotary_factor=partial)
    rope = RotaryEmbedding(RopeParams.from_hf_config(config), 64, 512)
    assert rope.rotary_dim == int(64 * partial)
    positions = torch.tensor([0, 3, 77, 511])
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(4, 4, 64, generator=gen)
    k = torch.randn(4, 2, 64, generator=gen)
    cos, sin = Phi3RotaryEmbedding(config)(q, positions[None])
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                          cos, sin)
    perm = rotary_permutation(64, rope.rotary_dim)
    assert sorted(perm.tolist()) == list(range(64))
    c, s = rope.lookup(positions)
    got_q, got_k = apply_rotary(q[..., perm], c, s), apply_rotary(k[..., perm], c, s)
    torch.testing.assert_close(got_q, want_q[0].transpose(0, 1)[..., perm])
    torch.testing.assert_close(got_k, want_k[0].transpose(0, 1)[..., perm])


def test_partial_rotation_outside_phi3_is_refused():
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1,
                                      intermediate_size=64, vocab_size=32,
                                      architectures=["LlamaForCausalLM"])
    config.rope_parameters["partial_rotary_factor"] = 0.5
    from cadence.model.attention import TorchAttentionBackend
    from cadence.model.decoder import CausalLM

    with pytest.raises(ValueError, match="partial_rotary_factor.*Phi3ForCausalLM"):
        CausalLM(config, TorchAttentionBackend())
    with pytest.raises(ValueError, match="an even number"):
        RotaryEmbedding(RopeParams(1e4, partial_rotary_factor=0.1), 16, 8)  # 1 of 16
