"""Decoder models (Llama, Mistral, Phi-3, Gemma, Qwen families), weights, attention backends."""

from __future__ import annotations

from cadence.model.attention import TorchAttentionBackend
from cadence.model.attention_metadata import AttentionBackend, AttentionMetadata
from cadence.model.decoder import CausalLM
from cadence.model.loader import build_model
from cadence.model.registry import ModelSpec, resolve_model

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "CausalLM",
    "ModelSpec",
    "TorchAttentionBackend",
    "build_model",
    "resolve_model",
]
