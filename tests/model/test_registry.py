"""resolve_model: presets, HF directories, the tiny model and the errors for bad input."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from cadence.model.arch import DecoderArch
from cadence.model.attention import TorchAttentionBackend
from cadence.model.decoder import CausalLM
from cadence.model.registry import resolve_model
from tests.model.helpers import hf_config

# Published parameter counts of the real models (tied embeddings counted once).
PRESET_PARAMS = {
    "qwen3-0.6b": 596_049_920,
    "qwen2.5-0.5b": 494_032_768,
    "llama3.2-1b": 1_235_814_400,
    "llama3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "phi3-mini-4k": 3_821_079_552,
    "gemma2-2b": 2_614_341_888,
    "gemma3-1b": 999_885_952,
    "qwen3-30b-a3b": 30_532_122_624,
}


def _count_from_shapes(config: transformers.PretrainedConfig) -> int:
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or h // heads
    qwen2 = config.model_type == "qwen2"
    if getattr(config, "num_experts", 0):  # every layer sparse: experts and the router
        i = config.num_experts * config.moe_intermediate_size
        h_router = config.num_experts * h
    else:
        h_router = 0
    layer = h * d * (heads + 2 * kv) + heads * d * h + 3 * h * i + 2 * h + h_router
    layer += d * (heads + 2 * kv) if qwen2 else 0  # q/k/v biases
    layer += 2 * d if config.model_type in ("qwen3", "qwen3_moe", "gemma3_text") else 0
    layer += 2 * h if config.model_type.startswith("gemma") else 0  # norms around the MLP
    embeddings = v * h * (1 if config.tie_word_embeddings else 2)
    return config.num_hidden_layers * layer + embeddings + h


@pytest.mark.parametrize("name", sorted(PRESET_PARAMS))
def test_presets_have_the_real_parameter_counts(name):
    spec = resolve_model(name)
    assert spec.is_preset and spec.path is None and spec.tokenizer_path is None
    assert spec.max_model_len == spec.hf_config.max_position_embeddings
    assert _count_from_shapes(spec.hf_config) == PRESET_PARAMS[name]
    with torch.device("meta"):  # shapes only, nothing allocated
        model = CausalLM(spec.hf_config, TorchAttentionBackend())
    assert sum(p.numel() for p in model.parameters()) == PRESET_PARAMS[name]


def test_preset_details():
    llama1b = resolve_model("llama3.2-1b", max_model_len=4096)
    assert llama1b.architecture == "LlamaForCausalLM" and llama1b.max_model_len == 4096
    assert llama1b.hf_config.rope_parameters["rope_type"] == "llama3"
    assert resolve_model("qwen3-0.6b").eos_token_ids == [151645]
    assert resolve_model("qwen2.5-0.5b").architecture == "Qwen2ForCausalLM"
    assert resolve_model("llama3-8b").hf_config.tie_word_embeddings is False
    mistral = resolve_model("mistral-7b")
    assert mistral.architecture == "MistralForCausalLM"
    assert DecoderArch.from_hf_config(mistral.hf_config).sliding_window == 4096
    phi3 = DecoderArch.from_hf_config(resolve_model("phi3-mini-4k").hf_config)
    assert phi3.fused_checkpoint and phi3.sliding_window == 2047
    gemma2 = DecoderArch.from_hf_config(resolve_model("gemma2-2b").hf_config)
    assert [gemma2.window(i) for i in range(3)] == [4096, 0, 4096]
    assert (gemma2.attn_softcap, gemma2.final_softcap, gemma2.scale) == (50.0, 30.0, 1 / 16)
    gemma3 = DecoderArch.from_hf_config(resolve_model("gemma3-1b").hf_config)
    assert [gemma3.window(i) for i in range(7)] == [512] * 5 + [0, 512]
    assert gemma3.qk_norm and gemma3.local_rope and gemma3.attn_softcap == 0.0
    moe = DecoderArch.from_hf_config(resolve_model("qwen3-30b-a3b").hf_config)
    assert all(moe.moe_layers) and len(moe.moe_layers) == 48
    assert (moe.num_experts, moe.num_experts_per_tok, moe.norm_topk_prob) == (128, 8, True)


def test_sliding_window_is_read_for_mistral_only():
    no_window = transformers.MistralConfig(sliding_window=None, architectures=["MistralForCausalLM"])
    assert DecoderArch.from_hf_config(no_window).sliding_window == 0
    # Qwen2 configs name a window that is unused while use_sliding_window is off.
    qwen2 = hf_config("qwen2", tie=False)
    qwen2.sliding_window = 64
    assert DecoderArch.from_hf_config(qwen2).sliding_window == 0


def test_directory_with_generation_config(tmp_path):
    hf_config("qwen3", tie=False).save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 2, 5]}))
    spec = resolve_model(str(tmp_path), max_model_len=100)
    assert spec.architecture == "Qwen3ForCausalLM" and not spec.is_preset
    assert spec.path == str(tmp_path) and spec.tokenizer_path is None  # no tokenizer files
    assert spec.max_model_len == 100 and spec.eos_token_ids == [5, 2]
    (tmp_path / "tokenizer.json").write_text("{}")
    assert resolve_model(str(tmp_path)).tokenizer_path == str(tmp_path)


def test_edge_values_a_checkpoint_may_hold(tmp_path):
    """An end-of-sequence id of 0 is a token id like any other; --max-model-len may be the
    model's whole context (not one less)."""
    config = hf_config("qwen3", tie=False)
    config.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    limit = config.max_position_embeddings
    spec = resolve_model(str(tmp_path), max_model_len=limit)
    assert spec.eos_token_ids == [0] and spec.max_model_len == limit
    with pytest.raises(ValueError, match="max_position_embeddings"):
        resolve_model(str(tmp_path), max_model_len=limit + 1)


def test_gemma3s_context_is_its_max_position_embeddings(tmp_path):
    """vLLM's exception: Gemma 3's max_position_embeddings already is its scaled length, so
    the linear RoPE factor of its full-attention layers does not multiply it (Gemma 3 text
    configs are of model type gemma3_text)."""
    config = hf_config("gemma3", tie=True)
    assert config.model_type == "gemma3_text"
    config.rope_parameters["full_attention"] = {
        **config.rope_parameters["full_attention"], "rope_type": "linear", "factor": 8.0}
    config.save_pretrained(tmp_path)
    assert resolve_model(str(tmp_path)).max_model_len == config.max_position_embeddings


@pytest.mark.parametrize(("text", "fragment"), [
    ("[]", "expected a JSON object, got list"),
    ('{"eos_token_id": [null]}', "eos_token_id: expected a token id or a list of them"),
    ('{"eos_token_id": "x"}', "eos_token_id: expected a token id"),
    ('{"eos_token_id": [2, -1]}', "eos_token_id: expected a token id"),
    ('{"eos_token_id": true}', "eos_token_id: expected a token id"),
    ("{bad json", "cannot be read as JSON"),
])
def test_a_broken_generation_config_is_a_value_error_naming_the_file(tmp_path, text, fragment):
    hf_config("qwen3", tie=False).save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(ValueError, match="generation_config.json") as info:
        resolve_model(str(tmp_path))
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_first_line_keeps_the_reason_after_an_announcing_line():
    from cadence.user_errors import first_line

    assert first_line(ValueError("Validation error for field 'x':\n  expected int")) == (
        "Validation error for field 'x': expected int")
    assert first_line(ValueError("plain\nmore")) == "plain"
    assert first_line(ValueError("  \n")) == "ValueError"
    assert first_line(ValueError("ends:")) == "ends:"


def test_eos_falls_back_to_config_and_max_len_to_positions(tmp_path):
    hf_config("llama", tie=False).save_pretrained(tmp_path)
    spec = resolve_model(str(tmp_path))
    assert spec.eos_token_ids == [2] and spec.max_model_len == 256


def test_architectures_written_as_one_string(tmp_path):
    hf_config("qwen3", tie=False).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["architectures"] = "Qwen3ForCausalLM"
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert resolve_model(str(tmp_path)).architecture == "Qwen3ForCausalLM"


def test_architecture_from_model_type_when_architectures_is_missing(tmp_path):
    config = hf_config("qwen2", tie=False)
    config.architectures = None
    config.save_pretrained(tmp_path)
    assert resolve_model(str(tmp_path)).architecture == "Qwen2ForCausalLM"


def test_max_model_len_above_positions_is_rejected():
    with pytest.raises(ValueError, match="max_model_len"):
        resolve_model("llama3-8b", max_model_len=8193)
    with pytest.raises(ValueError, match="max_model_len"):
        resolve_model("llama3-8b", max_model_len=0)


def test_missing_path_and_unknown_name(tmp_path):
    with pytest.raises(ValueError, match="model"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="never downloaded"):
        resolve_model("Qwen/Qwen3-0.6B")
    with pytest.raises(ValueError, match="config.json"):
        resolve_model(str(tmp_path))


def test_unsupported_architecture_names_it_and_the_supported_ones(tmp_path):
    transformers.GPT2Config(architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as err:
        resolve_model(str(tmp_path))
    message = str(err.value)
    assert "GPT2LMHeadModel" in message
    supported = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "LlamaForCausalLM",
                 "MistralForCausalLM", "Phi3ForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "Qwen3MoeForCausalLM")
    assert all(a in message for a in supported)
    assert "\n" not in message


def test_qwen_sliding_windows_and_gemma3_caps_as_transformers_reads_them():
    """Qwen2/Qwen3's use_sliding_window slides the layers from max_window_layers on,
    Qwen3-MoE's every layer; off, the configs' window is unused. Gemma 3 never applies an
    attn_logit_softcapping its config may carry (Gemma 2 does)."""

    def arch(config):
        return DecoderArch.from_hf_config(config)

    for cls, name in ((transformers.Qwen2Config, "Qwen2ForCausalLM"),
                      (transformers.Qwen3Config, "Qwen3ForCausalLM")):
        on = cls(num_hidden_layers=4, use_sliding_window=True, sliding_window=64,
                 max_window_layers=2, architectures=[name])
        assert [arch(on).window(i) for i in range(4)] == [0, 0, 64, 64]
        off = cls(num_hidden_layers=4, use_sliding_window=False, sliding_window=64,
                  max_window_layers=2, architectures=[name])
        assert [arch(off).window(i) for i in range(4)] == [0, 0, 0, 0]
    moe = transformers.Qwen3MoeConfig(num_hidden_layers=3, use_sliding_window=True,
                                      sliding_window=32, architectures=["Qwen3MoeForCausalLM"])
    assert [arch(moe).window(i) for i in range(3)] == [32, 32, 32]
    g3 = transformers.Gemma3TextConfig(attn_logit_softcapping=3.0,
                                       architectures=["Gemma3ForCausalLM"])
    assert arch(g3).attn_softcap == 0.0
    g2 = transformers.Gemma2Config(attn_logit_softcapping=3.0, architectures=["Gemma2ForCausalLM"])
    assert arch(g2).attn_softcap == 3.0


def test_unsupported_features_are_rejected(tmp_path):
    config = hf_config("llama", tie=False)
    config.hidden_act = "gelu"
    config.save_pretrained(tmp_path / "gelu")
    with pytest.raises(ValueError, match="hidden_act"):
        resolve_model(str(tmp_path / "gelu"))


def test_tiny_resolves_to_its_cache_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("CADENCE_CACHE_DIR", str(tmp_path))
    spec = resolve_model("tiny")
    assert spec.path == str(tmp_path / "tiny-v1") == spec.tokenizer_path
    assert spec.architecture == "Qwen3ForCausalLM" and not spec.is_preset
    assert spec.max_model_len == 2048 and spec.eos_token_ids == [637]


# From the published config.json of each model: (rope base, sliding layers' rope base,
# rms_norm_eps, max_position_embeddings).
PRESET_NUMBERS = {
    "qwen3-0.6b": (1e6, None, 1e-6, 40960),
    "qwen2.5-0.5b": (1e6, None, 1e-6, 32768),
    "llama3.2-1b": (500000.0, None, 1e-5, 131072),
    "llama3-8b": (500000.0, None, 1e-5, 8192),
    "mistral-7b": (10000.0, None, 1e-5, 32768),
    "phi3-mini-4k": (10000.0, None, 1e-5, 4096),
    "gemma2-2b": (10000.0, None, 1e-6, 8192),
    "gemma3-1b": (1e6, 10000.0, 1e-6, 32768),
    "qwen3-30b-a3b": (1e6, None, 1e-6, 40960),
}


@pytest.mark.parametrize("name", sorted(PRESET_NUMBERS))
def test_presets_have_the_real_rope_bases_and_norm_eps(name):
    """What the model reads from a preset: its rope bases and norm epsilon, as published."""
    from cadence.model.rope import RopeParams

    theta, local_theta, eps, positions = PRESET_NUMBERS[name]
    config = resolve_model(name).hf_config
    assert RopeParams.from_hf_config(config).theta == theta
    if local_theta is not None:
        assert RopeParams.from_hf_config(config, "sliding_attention").theta == local_theta
    arch = DecoderArch.from_hf_config(config)
    assert (arch.rms_norm_eps, arch.max_position_embeddings) == (eps, positions)


@pytest.mark.parametrize(("scaling", "expected"), [
    (None, 256),
    ({"rope_type": "linear", "factor": 2.0}, 512),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}, 512),
    ({"rope_type": "dynamic", "factor": 2.0}, 256),  # its base stretches with the length
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64}, 256),  # llama3 configs name the scaled length
])
def test_the_default_max_model_len_is_the_length_rope_scaling_is_made_for(
        tmp_path, scaling, expected):
    """vLLM's default: max_position_embeddings, times the factor for linear scaling, the
    original length times the factor for yarn (here 256 positions, yarn's original 128)."""
    config = hf_config("llama", tie=False)
    assert config.max_position_embeddings == 256
    config.rope_scaling = scaling
    config.save_pretrained(tmp_path)
    assert resolve_model(str(tmp_path)).max_model_len == expected
    assert resolve_model(str(tmp_path), max_model_len=100).max_model_len == 100


# Published in each model's config.json: (bos, eos, pad) ids, None where it names no pad.
PRESET_TOKEN_IDS = {
    "qwen3-0.6b": (151643, 151645, None),
    "qwen2.5-0.5b": (151643, 151643, None),
    "llama3.2-1b": (128000, 128001, None),
    "llama3-8b": (128000, 128001, None),
    "mistral-7b": (1, 2, None),
    "phi3-mini-4k": (1, 32000, 32000),
    "gemma2-2b": (2, 1, 0),
    "gemma3-1b": (2, 1, 0),
    "qwen3-30b-a3b": (151643, 151645, None),
}


@pytest.mark.parametrize("name", sorted(PRESET_TOKEN_IDS))
def test_presets_have_the_published_token_ids(name):
    bos, eos, pad = PRESET_TOKEN_IDS[name]
    spec = resolve_model(name)
    assert spec.eos_token_ids == [eos]
    assert spec.hf_config.bos_token_id == bos
    if pad is not None:
        assert spec.hf_config.pad_token_id == pad


def test_presets_have_the_published_rope_scaling_and_attention_scale():
    """Llama 3.2 1B's llama3 RoPE scaling (factor 32 from 8192 positions) and Gemma's
    query_pre_attn_scalar (256: a scale of 1/16) as their config.json files give them."""
    from cadence.model.rope import RopeParams

    rope = RopeParams.from_hf_config(resolve_model("llama3.2-1b").hf_config)
    assert (rope.rope_type, rope.theta, rope.factor, rope.low_freq_factor,
            rope.high_freq_factor, rope.original_max_position_embeddings) == (
        "llama3", 500000.0, 32.0, 1.0, 4.0, 8192)
    for name in ("gemma2-2b", "gemma3-1b"):
        assert DecoderArch.from_hf_config(resolve_model(name).hf_config).scale == 1 / 16


def test_hf_overrides_reach_a_preset():
    """A preset's config takes hf_overrides before anything is derived from it."""
    spec = resolve_model("qwen3-0.6b", hf_overrides={"max_position_embeddings": 1024,
                                                     "eos_token_id": 7})
    assert spec.hf_config.max_position_embeddings == 1024
    assert spec.max_model_len == 1024 and spec.eos_token_ids == [7]


def test_a_tokenizer_directory_needs_tokenizer_files(tmp_path):
    from cadence.model.registry import resolve_tokenizer

    with pytest.raises(ValueError, match="has no tokenizer files"):
        resolve_tokenizer(str(tmp_path))
    with pytest.raises(ValueError, match="is not a directory"):
        resolve_tokenizer(str(tmp_path / "nope"))
    (tmp_path / "tokenizer.json").write_text("{}")
    assert resolve_tokenizer(str(tmp_path)) == str(tmp_path)


def test_a_model_of_no_positions_is_refused():
    with pytest.raises(ValueError, match="max_position_embeddings must be at least 1"):
        resolve_model("qwen3-0.6b", hf_overrides={"max_position_embeddings": 0})
