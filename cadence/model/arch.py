"""What the decoder needs from an HF config: shapes and per-family features, read once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from transformers import PretrainedConfig

if TYPE_CHECKING:
    from cadence.model.fp8_checkpoint import Fp8Checkpoint

SUPPORTED_ARCHITECTURES = (
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Phi3ForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
)
_MODEL_TYPE_TO_ARCHITECTURE = {
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


SUPPORTED_QUANTIZATION_METHODS: tuple[str, ...] = ("fp8",)


def quantization_of(config: PretrainedConfig) -> str | None:
    """The checkpoint's quantization method (None: plain weights); any method but fp8 (e4m3
    weights dequantized at load) is refused in one line."""
    quant = getattr(config, "quantization_config", None)
    if not quant:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else quant
    method = str(getattr(method, "quant_method", method))
    if method == "fp8":
        from cadence.model.fp8_checkpoint import Fp8Checkpoint

        Fp8Checkpoint.from_config(quant)  # its format and block size are checked here
        return method
    raise ValueError(
        f"Unsupported quantization method {method!r} (the checkpoint's quantization_config); "
        f"supported: {', '.join(SUPPORTED_QUANTIZATION_METHODS)} (dequantized to the model "
        "dtype at load), and float16, bfloat16 and float32 checkpoints."
    )


def _fp8(config: PretrainedConfig) -> Fp8Checkpoint:
    from cadence.model.fp8_checkpoint import Fp8Checkpoint

    return Fp8Checkpoint.from_config(config.quantization_config)


def architecture_of(config: PretrainedConfig) -> str:
    """The config's architecture name; raises ValueError for one this package cannot run."""
    architectures = getattr(config, "architectures", None) or []
    if isinstance(architectures, str):  # a hand-written config's "architectures": "X"
        architectures = [architectures]
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
    # Per layer: whether it is a sliding-window layer (empty: every layer, when there is a window).
    layer_sliding: tuple[bool, ...] = ()
    # Gemma 2/3: (1 + w) RMSNorm in float32, norms before and after attention and MLP,
    # GELU-tanh MLP, embeddings times sqrt(hidden_size); sliding layers of Gemma 3 have their
    # own rope base ("sliding_attention" rope parameters).
    gemma: bool = False
    attn_scale: float = 0.0  # 0: head_dim ** -0.5
    attn_softcap: float = 0.0  # 0: none
    final_softcap: float = 0.0  # 0: none
    local_rope: bool = False
    # Mixture of experts (Qwen3-MoE): per layer, whether its MLP is the sparse one.
    moe_layers: tuple[bool, ...] = ()
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    # Tensor-parallel ranks the layers are split over (the shapes above are then one rank's).
    tp_size: int = 1
    # The checkpoint's quantization ("fp8": e4m3 weights, dequantized at load); None: plain.
    quantization: str | None = None
    # fp8 with block-wise scales: (rows, columns) of a block; (): per tensor or channel.
    quant_block: tuple[int, ...] = ()
    # fp8: the modules the checkpoint keeps in a float dtype (``Fp8Checkpoint.ignored``).
    quant_ignored: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.sliding_window < 0:
            raise ValueError(f"sliding_window must be >= 0, got {self.sliding_window}.")
        if self.layer_sliding and len(self.layer_sliding) != self.num_layers:
            raise ValueError(
                f"{len(self.layer_sliding)} layer types given for {self.num_layers} layers."
            )
        if any(self.moe_layers) and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be in "
                f"1 ... num_experts ({self.num_experts})."
            )

    def is_moe_layer(self, layer: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[layer]

    def window(self, layer: int) -> int:
        """The sliding window of ``layer`` (0: it attends to the whole sequence)."""
        if self.layer_sliding and not self.layer_sliding[layer]:
            return 0
        return self.sliding_window

    @property
    def scale(self) -> float:
        return self.attn_scale or self.head_dim**-0.5

    @classmethod
    def from_hf_config(cls, config: PretrainedConfig) -> DecoderArch:
        arch = architecture_of(config)
        quantization = quantization_of(config)
        fp8 = _fp8(config) if quantization == "fp8" else None
        gemma = arch in ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
        if gemma:
            act = getattr(config, "hidden_activation", None) or "gelu_pytorch_tanh"
            if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
                raise ValueError(f"Unsupported hidden_activation {act!r} for {arch}.")
        else:
            act = getattr(config, "hidden_act", "silu")
            if act != "silu":
                raise ValueError(
                    f"Unsupported hidden_act {act!r}; only 'silu' (SwiGLU) is supported."
                )
        num_heads = config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            value = getattr(config, name, None)
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ValueError(f"config.json: {name} must be a positive integer, got "
                                 f"{value!r}.")
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({num_heads}) must be a multiple of "
                f"num_key_value_heads ({num_kv_heads})."
            )
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        is_qwen2 = arch == "Qwen2ForCausalLM"
        is_phi3 = arch == "Phi3ForCausalLM"
        # Mistral's and Phi-3's window applies to every layer (None: no window). The Qwen
        # families carry a sliding_window that is unused unless use_sliding_window; then it
        # applies to the layers from max_window_layers on (Qwen2, Qwen3: transformers'
        # layer_types) or to every layer (Qwen3-MoE).
        qwen = arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
        windowed = (arch in ("MistralForCausalLM", "Phi3ForCausalLM") or gemma
                    or (qwen and bool(getattr(config, "use_sliding_window", False))))
        window = getattr(config, "sliding_window", None) if windowed else None
        layer_types = (tuple(getattr(config, "layer_types", None) or ())
                       if gemma or (windowed and qwen) else ())
        if windowed and qwen and not layer_types and arch != "Qwen3MoeForCausalLM":
            first = getattr(config, "max_window_layers", 0) or 0
            layer_types = tuple("sliding_attention" if i >= first else "full_attention"
                                for i in range(config.num_hidden_layers))
        unknown = set(layer_types) - {"sliding_attention", "full_attention"}
        if unknown:
            raise ValueError(f"Unsupported layer types {sorted(unknown)} in {arch}.")
        if gemma and getattr(config, "use_bidirectional_attention", False):
            raise ValueError("use_bidirectional_attention (an encoder) is not supported.")
        pre_attn = getattr(config, "query_pre_attn_scalar", None) if gemma else None
        moe_layers: tuple[bool, ...] = ()
        if arch == "Qwen3MoeForCausalLM" and getattr(config, "num_experts", 0):
            dense = set(getattr(config, "mlp_only_layers", None) or ())
            step = int(getattr(config, "decoder_sparse_step", 1) or 1)
            moe_layers = tuple(
                i not in dense and (i + 1) % step == 0 for i in range(config.num_hidden_layers)
            )
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
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM"),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_position_embeddings=config.max_position_embeddings,
            sliding_window=int(window or 0),
            fused_checkpoint=is_phi3,
            layer_sliding=tuple(t == "sliding_attention" for t in layer_types),
            gemma=gemma,
            attn_scale=float(pre_attn) ** -0.5 if pre_attn else 0.0,
            # Gemma 3 configs may carry attn_logit_softcapping, which its attention never
            # applies (transformers' Gemma3Attention passes no softcap): Gemma 2 only.
            attn_softcap=float(getattr(config, "attn_logit_softcapping", None) or 0.0)
            if arch == "Gemma2ForCausalLM" else 0.0,
            final_softcap=float(getattr(config, "final_logit_softcapping", None) or 0.0) if gemma else 0.0,
            local_rope=arch == "Gemma3ForCausalLM",
            moe_layers=moe_layers,
            num_experts=int(getattr(config, "num_experts", 0) or 0) if moe_layers else 0,
            num_experts_per_tok=int(getattr(config, "num_experts_per_tok", 0)) if moe_layers else 0,
            moe_intermediate_size=int(getattr(config, "moe_intermediate_size", 0))
            if moe_layers
            else 0,
            norm_topk_prob=bool(getattr(config, "norm_topk_prob", False)),
            quantization=quantization,
            quant_block=(fp8.block or ()) if fp8 is not None else (),
            quant_ignored=fp8.ignored if fp8 is not None else (),
        )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim
