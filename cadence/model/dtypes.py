"""The torch dtype and the rough size of a model, from its configuration."""

from __future__ import annotations

import torch

from cadence.config import resolved_dtype

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """The weights' and activations' dtype of ``--dtype`` (``auto`` by device) on ``device``."""
    return _DTYPES[resolved_dtype(dtype, device)]


def kv_cache_dtype(cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type: the model's (``auto``) or e4m3 (``fp8``)."""
    return torch.float8_e4m3fn if cache_dtype == "fp8" else model_dtype


def approx_num_params(hf_config) -> int:
    """Parameters of a decoder from its config (attention, MLP and embeddings), for sizing."""
    hidden = hf_config.hidden_size
    inter = getattr(hf_config, "intermediate_size", 4 * hidden)
    layers = hf_config.num_hidden_layers
    return layers * (4 * hidden * hidden + 3 * hidden * inter) + hf_config.vocab_size * hidden
