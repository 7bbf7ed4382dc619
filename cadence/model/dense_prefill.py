"""Dense causal attention for a lone prompt prefilled from position 0.

Such a pass (``AttentionMetadata.fresh_prompt``) needs no key from the paged cache: every key it
sees is one of its own, in order, in the contiguous k and v. Two kernels attend it: a Triton
kernel of short query blocks (``causal_attention``) while the pass's causal work is small, and
cuDNN's fused attention (through torch's ``scaled_dot_product_attention`` with the cuDNN
backend, grouped-query heads native) past ``TRITON_MAX_WORK``, where its large tiles lead. Both
are faster than the paged varlen kernel (docs/perf.md: runs BV, the causal tile sweep). The K/V
still go to the cache first, for later steps.

Only CUDA graphs of a lone fresh prompt take this path (the runner's fresh graphs, one per
token bucket): cuDNN plans once per shape (~0.1 s) and keeps every plan, so eager passes, whose
lengths are any, stay on the varlen kernel. Layers with a sliding window or soft-capped scores
(Mistral, Phi-3, Gemma 2) take the Triton kernel only: cuDNN's causal call has neither.
"""

from __future__ import annotations

import logging

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from cadence.model import causal_attention as _causal

logger = logging.getLogger(__name__)

__all__ = ["DensePrefill"]

# Below this many tokens the varlen kernel beats cuDNN (docs/perf.md, run BW, varlen against
# cuDNN: 15 against 29 us at 256 tokens, 21.5 against 47.5 at 512); at 768 cuDNN leads.
CUDNN_MIN_TOKENS = 768
# The Triton kernel beats the varlen kernel from here (H100, Qwen3-0.6B heads: 6.4 against
# 9.7 us at 128 tokens, 8.4 against 12.9 at 256; docs/perf.md, runs ZZN-ZZQ).
TRITON_MIN_TOKENS = 128
# Causal work (query heads x tokens^2) up to which the Triton kernel leads or ties cuDNN
# (same runs: 16 heads 2048 tokens 48.9 against 53.2 us, 3072 103 against 92; 32 heads 1024
# tokens 29.1 against 32.2, 2048 90.7 against 83.4).
TRITON_MAX_WORK = 16 * 2048 * 2048
_DTYPES = (torch.float16, torch.bfloat16)
# torch's CUDA error type (torch.AcceleratorError, newer torch; a RuntimeError subclass).
_ACCELERATOR_ERROR = getattr(torch, "AcceleratorError", torch.OutOfMemoryError)


def _plain(sliding_window: int, softcap: float) -> bool:
    """A layer without a window or soft cap (one cuDNN's causal call can take)."""
    return sliding_window <= 0 and softcap <= 0.0


class DensePrefill:
    """Whether a prefill pass may attend densely, and that attention.

    Two kernels: ``triton`` (``causal_attention``, up to ``max_triton_work``) and ``cudnn``
    (past it). Each turns off for good at its first refused call (a kernel that does not
    compile or load; a shape or build cuDNN does not run): the other then takes every pass, and
    with both off every pass goes through the varlen kernel. ``probe`` makes a first small call
    of each per layer shape before the runner captures any graph with the path; out of memory
    or a CUDA error is raised, not taken for a refusal. ``min_tokens`` (default: the Triton
    kernel's minimum while it is on, else cuDNN's) is where the path starts."""

    def __init__(self, enabled: bool = True, min_tokens: int | None = None,
                 use_triton: bool = True, max_triton_work: int = TRITON_MAX_WORK) -> None:
        if min_tokens is not None and min_tokens < 1:
            raise ValueError(f"min_tokens must be at least 1, got {min_tokens}")
        if max_triton_work < 0:
            raise ValueError(f"max_triton_work must be at least 0, got {max_triton_work}")
        self.cudnn = enabled
        self.triton = enabled and use_triton and _causal.triton is not None
        self.max_triton_work = max_triton_work
        self._min_tokens = min_tokens
        self.calls = 0  # passes attended densely (host calls: a captured pass counts once)
        self.triton_calls = 0  # of which through the Triton kernel
        self._probed: dict[tuple, bool] = {}
        self._sms: dict[torch.device, int] = {}

    @property
    def enabled(self) -> bool:
        return self.cudnn or self.triton

    @property
    def min_tokens(self) -> int:
        if self._min_tokens is not None:
            return self._min_tokens
        return TRITON_MIN_TOKENS if self.triton else CUDNN_MIN_TOKENS

    def probe(self, dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int,
              device: torch.device, sliding_window: int = 0, softcap: float = 0.0) -> bool:
        """Whether a kernel runs this layer shape: one small call of each per shape, before
        any graph is captured with the path (a refusal turns that kernel off for good). A
        windowed or capped layer asks the Triton kernel only, with a window it applies."""
        only_triton = not _plain(sliding_window, softcap)
        key = (dtype, num_heads, num_kv_heads, head_dim, device, sliding_window > 0,
               softcap > 0)
        if key not in self._probed:
            q = torch.zeros(16, num_heads, head_dim, dtype=dtype, device=device)
            kv = torch.zeros(16, num_kv_heads, head_dim, dtype=dtype, device=device)
            scale = head_dim**-0.5
            window = min(sliding_window, 8)  # under the probe's 16 tokens: the window variant
            ran = self.triton and self._triton(q, kv, kv, scale, window, softcap) is not None
            if not only_triton:
                ran = (self.cudnn and self._cudnn(q, kv, kv, scale) is not None) or ran
            self._probed[key] = ran
        return self._probed[key] and (self.triton if only_triton else self.enabled)

    def supports(self, dtype: torch.dtype, head_dim: int, cache_dtype: torch.dtype,
                 sliding_window: int, softcap: float, device: torch.device) -> bool:
        """The layer's static side: a CUDA half-precision model, head dim a multiple of 8 up
        to 128, a cache in the model's dtype (an FP8 cache's rounding is what the other paths
        attend over); a window or soft cap only while the Triton kernel is on."""
        on = self.enabled if _plain(sliding_window, softcap) else self.triton
        return (on and device.type == "cuda" and dtype in _DTYPES and cache_dtype == dtype
                and head_dim % 8 == 0 and head_dim <= 128)

    def applies(self, q: torch.Tensor, kv_cache: torch.Tensor, fresh_prompt: bool,
                sliding_window: int, softcap: float) -> bool:
        """Whether this pass attends densely: a lone fresh prompt of enough tokens in a layer
        the path supports."""
        return (fresh_prompt and q.shape[0] >= self.min_tokens
                and self.supports(q.dtype, q.shape[2], kv_cache.dtype, sliding_window, softcap,
                                  q.device))

    def prefers_triton(self, num_tokens: int, num_heads: int) -> bool:
        """Whether a pass of this size goes to the Triton kernel (while both are on)."""
        return self.triton and (not self.cudnn
                                or num_heads * num_tokens * num_tokens <= self.max_triton_work)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               sliding_window: int = 0, softcap: float = 0.0) -> torch.Tensor | None:
        """Causal attention of ``q`` ``[T, H, D]`` over ``k``, ``v`` ``[T, Hkv, D]`` (any
        strides with a contiguous last dim) as one sequence: ``[T, H, D]``, or None where
        both kernels refuse (the path is then off for good; a windowed or capped pass asks
        the Triton kernel only)."""
        plain = _plain(sliding_window, softcap)
        prefer = not plain or self.prefers_triton(q.shape[0], q.shape[1])
        for triton in (prefer, not prefer):  # the other kernel where the first refuses
            if triton and self.triton:
                out = self._triton(q, k, v, scale, sliding_window, softcap)
            elif not triton and self.cudnn and plain:
                out = self._cudnn(q, k, v, scale)
            else:
                continue
            if out is not None:
                self.calls += 1
                self.triton_calls += triton
                return out
        if not plain and self.cudnn:
            # NOTE: a windowed layer without a kernel turns the path off for every layer: one
            # pass must not mix dense and varlen layers (``CausalLM.dense_prefill_min_tokens``).
            self.cudnn = False
            logger.warning("Dense prefill attention is off: no kernel takes windowed or capped "
                           "layers; every prefill goes through the varlen kernel.")
        return None

    def _refused(self, exc: Exception, q: torch.Tensor, kernel: str) -> None:
        # NOTE: out of memory, a CUDA error or a failure inside a capture is not a refusal.
        if (isinstance(exc, (torch.OutOfMemoryError, _ACCELERATOR_ERROR))
                or (q.is_cuda and torch.cuda.is_current_stream_capturing())):
            raise exc
        if kernel == "cuDNN":
            self.cudnn = False
        else:
            self.triton = False
        rest = ("the Triton kernel takes every pass" if self.triton
                else "cuDNN takes every pass" if self.cudnn
                else "every prefill goes through the varlen kernel")
        logger.warning("Dense prefill attention through %s is unavailable (%s); %s.", kernel,
                       (str(exc).splitlines() or [type(exc).__name__])[0], rest)

    def _triton(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                sliding_window: int = 0, softcap: float = 0.0) -> torch.Tensor | None:
        out = torch.empty_like(q)
        try:
            _causal.causal_attention(q, k, v, out, scale, num_sms=self._num_sms(q.device),
                                     sliding_window=sliding_window, softcap=softcap)
        except (ValueError, TypeError):  # a bad call, not a refusal
            raise
        except Exception as exc:  # noqa: BLE001 - compile / load failures have many types
            self._refused(exc, q, "the Triton kernel")
            return None
        return out

    def _cudnn(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor | None:
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                    is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
                )  # fmt: skip
        except RuntimeError as exc:
            self._refused(exc, q, "cuDNN")
            return None
        return out[0].transpose(0, 1)

    def _num_sms(self, device: torch.device) -> int:
        if device.type != "cuda":
            return 0
        if device not in self._sms:
            self._sms[device] = torch.cuda.get_device_properties(device).multi_processor_count
        return self._sms[device]
