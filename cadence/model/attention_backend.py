"""Which attention backend a device gets: Triton on CUDA (where it imports), the torch reference
elsewhere."""

from __future__ import annotations

import logging

from cadence.model.attention_metadata import AttentionBackend

logger = logging.getLogger(__name__)


def make_attention_backend(device: str) -> AttentionBackend:
    """Triton attention on CUDA (where Triton imports), the torch reference elsewhere."""
    if device == "cuda":
        try:
            from cadence.model.triton_backend import TritonAttentionBackend

            return TritonAttentionBackend()
        except ImportError:  # pragma: no cover - depends on the install
            logger.warning("Triton attention unavailable; using the torch reference backend")
    from cadence.model.attention import TorchAttentionBackend

    return TorchAttentionBackend()
