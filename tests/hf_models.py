"""Tiny random Hugging Face checkpoints, built in the tests (float32, CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import transformers

VOCAB = 256

# Transformers writes rope_theta into the scaling dict a config is given: pass a copy.
LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


YARN_ROPE_SCALING = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}

# Shorter than most test prompts, and not a multiple of the KV block size.
MISTRAL_WINDOW = 12


def hf_config(
    family: str, tie: bool, llama_rope_theta: float, **fields: Any
) -> transformers.PretrainedConfig:
    """``_family_config`` with transformers' eager attention: the reference is the plain math.
    (Some transformers versions pick SDPA for Gemma 2, which drops its attention soft-capping.)"""
    config = _family_config(family, tie, llama_rope_theta, **fields)
    config._attn_implementation = "eager"
    return config


def _family_config(
    family: str, tie: bool, llama_rope_theta: float, **fields: Any
) -> transformers.PretrainedConfig:
    """A config of ``family`` with the sizes and token ids in ``fields``.

    "llama" has llama3 rope scaling over ``llama_rope_theta``, "llama-yarn" yarn rope scaling, "phi3" and "phi3-long" longrope scaling ("phi4-mini" rotating part of each head), "gemma2" and "gemma3" their
    per-layer windows, caps and rope bases, "qwen3-moe" a mixture of experts, "llama-bias" attention and MLP
    biases, "qwen3" a head_dim such that head_dim * num_heads != hidden_size, as in the real
    Qwen3 models, "mistral" a sliding window of ``MISTRAL_WINDOW`` tokens, "qwen2-window" and
    "qwen3-moe-window" the Qwen families' use_sliding_window (per layer for Qwen2).
    """
    import transformers

    fields["tie_word_embeddings"] = tie
    if family == "llama":
        return transformers.LlamaConfig(
            **fields,
            rope_theta=llama_rope_theta,
            rope_scaling=dict(LLAMA3_ROPE_SCALING),
            architectures=["LlamaForCausalLM"],
        )
    if family == "llama-yarn":
        return transformers.LlamaConfig(
            **fields, rope_scaling=dict(YARN_ROPE_SCALING), architectures=["LlamaForCausalLM"]
        )
    if family == "llama-bias":
        return transformers.LlamaConfig(
            **fields, attention_bias=True, mlp_bias=True, architectures=["LlamaForCausalLM"]
        )
    if family == "mistral":
        return transformers.MistralConfig(
            **fields, sliding_window=MISTRAL_WINDOW, architectures=["MistralForCausalLM"]
        )
    if family in ("phi3", "phi3-long", "phi4-mini"):
        # "phi3": every test sequence stays within the original length (short factors);
        # "phi3-long": prompts of more than 32 tokens run on the long factors from the start;
        # "phi4-mini": that, rotating three quarters of each head (partial_rotary_factor).
        original = 128 if family == "phi3" else 32
        partial = 0.75 if family == "phi4-mini" else 1.0
        head_dim = fields["hidden_size"] // fields["num_attention_heads"]
        rotated = int(head_dim * partial)
        gen = torch.Generator().manual_seed(7)
        scaling = {
            "rope_type": "longrope",
            "short_factor": (1 + torch.rand(rotated // 2, generator=gen)).tolist(),
            "long_factor": (1 + 8 * torch.rand(rotated // 2, generator=gen)).tolist(),
        }
        fields.setdefault("pad_token_id", 0)  # Phi-3's default (32000) is past this vocab
        return transformers.Phi3Config(
            **fields,
            rope_scaling=scaling,
            original_max_position_embeddings=original,
            sliding_window=MISTRAL_WINDOW + 9,
            partial_rotary_factor=partial,
            architectures=["Phi3ForCausalLM"],
        )
    if family == "gemma2":
        # Caps low enough to bend these random scores and logits; layers alternate
        # sliding (even) and full (odd).
        return transformers.Gemma2Config(
            **fields, head_dim=32, query_pre_attn_scalar=24, sliding_window=MISTRAL_WINDOW,
            attn_logit_softcapping=5.0, final_logit_softcapping=20.0,
            architectures=["Gemma2ForCausalLM"],
        )  # fmt: skip
    if family == "gemma3":
        # Layer 0 sliding (local rope base 10000), layer 1 full (base 1e6, linear scaling).
        return transformers.Gemma3TextConfig(
            **fields, head_dim=32, query_pre_attn_scalar=24, sliding_window=MISTRAL_WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            },
            architectures=["Gemma3ForCausalLM"],
        )  # fmt: skip
    if family == "qwen3-moe":
        # 8 experts, 3 per token, renormalized; layer 1 keeps a dense MLP.
        return transformers.Qwen3MoeConfig(
            **fields, head_dim=32, num_experts=8, num_experts_per_tok=3,
            moe_intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[1],
            architectures=["Qwen3MoeForCausalLM"],
        )  # fmt: skip
    if family == "qwen2":
        return transformers.Qwen2Config(**fields, architectures=["Qwen2ForCausalLM"])
    if family == "qwen2-window":
        # use_sliding_window: layers from max_window_layers (1) on slide, layer 0 sees all.
        return transformers.Qwen2Config(
            **fields, use_sliding_window=True, sliding_window=MISTRAL_WINDOW, max_window_layers=1,
            architectures=["Qwen2ForCausalLM"],
        )  # fmt: skip
    if family == "qwen3-moe-window":
        # Qwen3-MoE's use_sliding_window slides every layer.
        return transformers.Qwen3MoeConfig(
            **fields, head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
            use_sliding_window=True, sliding_window=MISTRAL_WINDOW,
            architectures=["Qwen3MoeForCausalLM"],
        )  # fmt: skip
    if family == "qwen3":
        return transformers.Qwen3Config(**fields, head_dim=32, architectures=["Qwen3ForCausalLM"])
    raise ValueError(family)


def build_hf_model(arch: str, path: Path, tie: bool = False, seed: int = 0,
                   max_positions: int = 512):
    """Build, save and return a random HF causal LM of the given family."""
    import transformers

    torch.manual_seed(seed)
    cfg = hf_config(
        arch,
        tie,
        llama_rope_theta=500000.0,
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = getattr(transformers, cfg.architectures[0])(cfg)
    # Random init is small; scale weights up a little so logits are well separated.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(4.0)
            elif arch.startswith("gemma"):  # (1 + w) norms start at w = 0: give them some shape
                p.normal_(0.0, 0.3)
    model = model.float().eval()
    model.save_pretrained(path)
    return model


def save_llama(path: Path, seed: int = 0, **fields: Any):
    """A random two-layer Llama (eager attention, weights scaled up as ``build_hf_model``'s)
    with ``fields`` set on its config, saved at ``path``; returns the model."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{
        "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "architectures": ["LlamaForCausalLM"], **fields})
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(4.0)
    model.float().eval().save_pretrained(path)
    return model


def hf_greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuation of each prompt, one at a time (no padding), ignoring EOS.

    A longrope model runs without transformers' cache: every step then attends over keys rotated
    for the whole sequence's length, as when transformers recomputes its cache at the switch to
    the long factors. Releases differ there (5.25 recomputes, 5.17 resets the cache and gives
    other tokens a few steps past the switch); without the cache the reference is the same in
    each."""
    out = []
    model.generation_config.eos_token_id = None
    config = model.config
    scaling = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    use_cache = scaling.get("rope_type") != "longrope"
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                eos_token_id=None,
                pad_token_id=0,
                use_cache=use_cache,
            )
        out.append(gen[0, len(p) :].tolist())
    return out
