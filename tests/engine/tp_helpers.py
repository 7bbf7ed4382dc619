"""Small random checkpoints for the tensor-parallel tests, and the processes an engine left."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tests.hf_models import hf_config


def build_checkpoint(path: Path, family: str, *, kv_heads: int, vocab: int, tie: bool,
                     seed: int = 0) -> Path:
    """A float32 checkpoint of ``family`` with 4 attention heads and ``kv_heads`` KV heads."""
    import transformers

    torch.manual_seed(seed)
    cfg = hf_config(family, tie, llama_rope_theta=500000.0, vocab_size=vocab, hidden_size=64,
                    intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=kv_heads, max_position_embeddings=512,
                    rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = getattr(transformers, cfg.architectures[0])(cfg)
    with torch.no_grad():  # larger than the default init: well separated logits
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
            elif "norm" not in name:
                p.mul_(4.0)
    model.float().eval().save_pretrained(path)
    return path


def child_pids(pid: int | None = None) -> list[int]:
    """Live child processes of ``pid`` (this process by default), from /proc."""
    pid = os.getpid() if pid is None else pid
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                found.extend(int(c) for c in f.read().split())
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return sorted(found)
