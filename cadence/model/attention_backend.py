"""Which attention backend a device gets: Triton on CUDA (where it imports), the torch reference
elsewhere."""

from __future__ import annotations

import logging

from cadence.model.attention_metadata import AttentionBackend

logger = logging.getLogger(__name__)


def make_attention_backend(device: str, fp8_weights: bool = False) -> AttentionBackend:
    """Triton attention on CUDA (where Triton imports), the torch reference elsewhere.
    ``fp8_weights``: the model's projections hold e4m3 weights (its decode attention then keeps
    the plain load order at batch 1, which measured faster there)."""
    if device == "cuda":
        try:
            from cadence.model.triton_backend import TritonAttentionBackend

            return TritonAttentionBackend(early_decode=not fp8_weights)
        except ImportError:  # pragma: no cover - depends on the install
            logger.warning("Triton attention unavailable; using the torch reference backend")
    from cadence.model.attention import TorchAttentionBackend

    return TorchAttentionBackend()
