"""Dense causal attention for a lone prompt prefilled from position 0.

Such a pass (``AttentionMetadata.fresh_prompt``) needs no key from the paged cache: every key it
sees is one of its own, in order, in the contiguous k and v. cuDNN's fused attention (through
torch's ``scaled_dot_product_attention`` with the cuDNN backend, grouped-query heads native)
attends them 1.3-1.5x faster than the paged varlen kernel from 1024 tokens on the H200
(docs/perf.md, run BV). The K/V still go to the cache first, for later steps.

Only CUDA graphs of a lone fresh prompt take this path (the runner's fresh graphs, one per
token bucket): cuDNN plans once per shape (~0.1 s) and keeps every plan, so eager passes, whose
lengths are any, stay on the varlen kernel.
"""

from __future__ import annotations

import logging

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

logger = logging.getLogger(__name__)

__all__ = ["DensePrefill"]

# Below this many tokens the varlen kernel is faster (docs/perf.md, run BW, varlen against cuDNN:
# 15 against 29 us at 256 tokens, 21.5 against 47.5 at 512); at 768 cuDNN leads, 21.7 against 27.9.
DEFAULT_MIN_TOKENS = 768
_DTYPES = (torch.float16, torch.bfloat16)
# torch's CUDA error type (torch.AcceleratorError, newer torch; a RuntimeError subclass).
_ACCELERATOR_ERROR = getattr(torch, "AcceleratorError", torch.OutOfMemoryError)


class DensePrefill:
    """Whether a prefill pass may attend densely through cuDNN, and that attention.

    ``enabled`` turns off for good at the first call cuDNN refuses (an unsupported shape or
    build): the pass, and every later one, goes through the varlen kernel instead. ``probe``
    makes a first small call per layer shape before the runner captures any graph with the
    path; out of memory or a CUDA error is raised, not taken for a refusal."""

    def __init__(self, enabled: bool = True, min_tokens: int = DEFAULT_MIN_TOKENS) -> None:
        if min_tokens < 1:
            raise ValueError(f"min_tokens must be at least 1, got {min_tokens}")
        self.enabled = enabled
        self.min_tokens = min_tokens
        self.calls = 0  # passes attended densely (host calls: a captured pass counts once)
        self._probed: dict[tuple, bool] = {}

    def probe(self, dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int,
              device: torch.device) -> bool:
        """Whether cuDNN runs this layer shape: one small call per shape, before any graph is
        captured with the path (a refusal turns the path off for good)."""
        key = (dtype, num_heads, num_kv_heads, head_dim, device)
        if key not in self._probed:
            q = torch.zeros(16, num_heads, head_dim, dtype=dtype, device=device)
            kv = torch.zeros(16, num_kv_heads, head_dim, dtype=dtype, device=device)
            self._probed[key] = self._attend(q, kv, kv, head_dim**-0.5) is not None
        return self._probed[key] and self.enabled

    def supports(self, dtype: torch.dtype, head_dim: int, cache_dtype: torch.dtype,
                 sliding_window: int, softcap: float, device: torch.device) -> bool:
        """The layer's static side: a CUDA half-precision model, head dim a multiple of 8 up
        to 128, no window or soft cap, a cache in the model's dtype (an FP8 cache's rounding is
        what the other paths attend over)."""
        return (self.enabled and device.type == "cuda" and dtype in _DTYPES
                and cache_dtype == dtype and head_dim % 8 == 0 and head_dim <= 128
                and sliding_window == 0 and softcap == 0.0)

    def applies(self, q: torch.Tensor, kv_cache: torch.Tensor, fresh_prompt: bool,
                sliding_window: int, softcap: float) -> bool:
        """Whether this pass attends densely: a lone fresh prompt of enough tokens in a layer
        the path supports."""
        return (fresh_prompt and q.shape[0] >= self.min_tokens
                and self.supports(q.dtype, q.shape[2], kv_cache.dtype, sliding_window, softcap,
                                  q.device))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor | None:
        """Causal attention of ``q`` ``[T, H, D]`` over ``k``, ``v`` ``[T, Hkv, D]`` (any
        strides with a contiguous last dim) as one sequence: ``[T, H, D]``, or None (and off
        for good) where cuDNN refuses."""
        out = self._attend(q, k, v, scale)
        if out is not None:
            self.calls += 1
        return out

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                scale: float) -> torch.Tensor | None:
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                    is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
                )  # fmt: skip
        except RuntimeError as exc:
            # NOTE: out of memory, a CUDA error or a failure inside a capture is not a refusal.
            if (isinstance(exc, (torch.OutOfMemoryError, _ACCELERATOR_ERROR))
                    or (q.is_cuda and torch.cuda.is_current_stream_capturing())):
                raise
            self.enabled = False
            logger.warning("Dense prefill attention through cuDNN is unavailable (%s); every "
                           "prefill goes through the varlen kernel.", str(exc).splitlines()[0])
            return None
        return out[0].transpose(0, 1)
