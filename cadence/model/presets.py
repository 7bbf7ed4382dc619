"""Shape presets: the configs of real models, written here so that no hub access is ever needed.

Presets carry no weights and no tokenizer; they exist for benchmarks with ``load_format="dummy"``.
"""

from __future__ import annotations

from typing import Any

from transformers import (
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
)

_QWEN_VOCAB = 151936
_LLAMA3_VOCAB = 128256

PRESETS: dict[str, tuple[type[PretrainedConfig], dict[str, Any]]] = {
    "qwen3-0.6b": (
        Qwen3Config,
        {
            "architectures": ["Qwen3ForCausalLM"],
            "vocab_size": _QWEN_VOCAB,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "hidden_act": "silu",
            "bos_token_id": 151643,
            "eos_token_id": 151645,
        },
    ),
    "qwen2.5-0.5b": (
        Qwen2Config,
        {
            "architectures": ["Qwen2ForCausalLM"],
            "vocab_size": _QWEN_VOCAB,
            "hidden_size": 896,
            "intermediate_size": 4864,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "max_position_embeddings": 32768,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
            "use_sliding_window": False,
            "hidden_act": "silu",
            "bos_token_id": 151643,
            "eos_token_id": 151643,
        },
    ),
    "llama3.2-1b": (
        LlamaConfig,
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": _LLAMA3_VOCAB,
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "max_position_embeddings": 131072,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "mlp_bias": False,
            "hidden_act": "silu",
            "bos_token_id": 128000,
            "eos_token_id": 128001,
        },
    ),
    "llama3-8b": (
        LlamaConfig,
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": _LLAMA3_VOCAB,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 8192,
            "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "hidden_act": "silu",
            "bos_token_id": 128000,
            "eos_token_id": 128001,
        },
    ),
    "mistral-7b": (  # v0.1: the sliding-window release
        MistralConfig,
        {
            "architectures": ["MistralForCausalLM"],
            "vocab_size": 32000,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 32768,
            "rope_theta": 10000.0,
            "sliding_window": 4096,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    "phi3-mini-4k": (
        Phi3Config,
        {
            "architectures": ["Phi3ForCausalLM"],
            "vocab_size": 32064,
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "max_position_embeddings": 4096,
            "original_max_position_embeddings": 4096,
            "rope_theta": 10000.0,
            "sliding_window": 2047,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 32000,
            "pad_token_id": 32000,
        },
    ),
}


def preset_config(name: str) -> PretrainedConfig:
    """A fresh config object for the preset ``name`` (KeyError if there is none)."""
    config_cls, values = PRESETS[name]
    return config_cls(**values)
