"""What the decoder needs from an HF config: shapes and per-family features, read once."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Phi3ForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
_MODEL_TYPE_TO_ARCHITECTURE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def architecture_of(config: PretrainedConfig) -> str:
    """The config's architecture name; raises ValueError for one this package cannot run."""
    architectures = getattr(config, "architectures", None) or []
    if architectures:
        arch = architectures[0]
    else:
        model_type = getattr(config, "model_type", "")
        arch = _MODEL_TYPE_TO_ARCHITECTURE.get(model_type, f"<model_type {model_type!r}>")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"Unsupported model architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}."
        )
    return arch


@dataclass(frozen=True)
class DecoderArch:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    # Each query sees at most its last `sliding_window` keys (itself included); 0: no window.
    sliding_window: int = 0
    # The checkpoint stores q/k/v as one qkv_proj and gate/up as one gate_up_proj (Phi-3).
    fused_checkpoint: bool = False

    def __post_init__(self) -> None:
        if self.sliding_window < 0:
            raise ValueError(f"sliding_window must be >= 0, got {self.sliding_window}.")

    @classmethod
    def from_hf_config(cls, config: PretrainedConfig) -> DecoderArch:
        arch = architecture_of(config)
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"Unsupported hidden_act {act!r}; only 'silu' (SwiGLU) is supported.")
        if getattr(config, "use_sliding_window", False):
            raise ValueError("Sliding-window attention (use_sliding_window=True) is not supported.")
        num_heads = config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({num_heads}) must be a multiple of "
                f"num_key_value_heads ({num_kv_heads})."
            )
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        is_qwen2 = arch == "Qwen2ForCausalLM"
        is_phi3 = arch == "Phi3ForCausalLM"
        # Mistral's and Phi-3's window applies to every layer (None: no window); Qwen2 configs
        # carry a sliding_window that is unused unless use_sliding_window (refused above).
        windowed = arch in ("MistralForCausalLM", "Phi3ForCausalLM")
        window = getattr(config, "sliding_window", None) if windowed else None
        if is_phi3:
            attention_bias = False  # Phi-3 has no biases whatever the config says
        return cls(
            architecture=arch,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.rms_norm_eps),
            # Qwen2 always has q/k/v biases and never an o_proj bias.
            qkv_bias=True if is_qwen2 else attention_bias,
            o_bias=False if is_qwen2 else attention_bias,
            mlp_bias=False if is_phi3 else bool(getattr(config, "mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_position_embeddings=config.max_position_embeddings,
            sliding_window=int(window or 0),
            fused_checkpoint=is_phi3,
        )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim
