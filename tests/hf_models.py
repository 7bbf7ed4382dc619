"""Tiny random Hugging Face checkpoints, built in the tests (float32, CPU)."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 256


def _common() -> dict:
    return dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def build_hf_model(arch: str, path: Path, tie: bool = False, seed: int = 0):
    """Build, save and return a random HF causal LM of the given family."""
    import transformers

    torch.manual_seed(seed)
    if arch == "llama":
        cfg = transformers.LlamaConfig(
            **_common(), tie_word_embeddings=tie,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            rope_theta=500000.0,
        )
        model = transformers.LlamaForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**_common(), tie_word_embeddings=tie)
        model = transformers.Qwen2ForCausalLM(cfg)
    elif arch == "qwen3":
        cfg = transformers.Qwen3Config(**_common(), head_dim=32, tie_word_embeddings=tie)
        model = transformers.Qwen3ForCausalLM(cfg)
    else:
        raise ValueError(arch)
    # Random init is small; scale weights up a little so logits are well separated.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(4.0)
    model = model.float().eval()
    model.save_pretrained(path)
    return model


def hf_greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuation of each prompt, one at a time (no padding), ignoring EOS."""
    out = []
    model.generation_config.eos_token_id = None
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                                 eos_token_id=None, pad_token_id=0)
        out.append(gen[0, len(p):].tolist())
    return out
