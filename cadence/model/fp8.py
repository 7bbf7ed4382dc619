"""FP8 (e4m3) weights and activations: ``--quantization fp8``.

At load every projection of the decoder layers (qkv, o, gate_up, down) and every MoE expert is
quantized to e4m3 with one scale per output channel (``amax / 448``), but those an FP8
checkpoint keeps in float (``KeepList``); the embedding, the LM head and MoE routers stay in the
model dtype. (The experts run weight-only at every batch size: the
grouped GEMMs convert their tiles and apply the row scales to the sums.) At run time a GEMM of
few rows (decode) streams the FP8 weight into a Triton kernel that multiplies it with the
activations in the model dtype and applies the channel scales at the end (weights in FP8,
activations not: half the bytes of a bf16 step; one row, where ``bulk_gemv``'s e4m3 table
lists the shape, through the bulk-copy GEMV instead); a larger GEMM (prefill) quantizes each token's
activations with a scale of its own and multiplies the two FP8 operands on the tensor cores with
float32 accumulation (``torch._scaled_mm``'s row-wise scaling). On the CPU the same arithmetic
is emulated in float32.
"""

from __future__ import annotations

import logging
import re

import torch
from torch import nn

from cadence.model import fp8_kernels
from cadence.model.bulk_gemv import BulkConfig, bulk_gemv, bulk_gemv_norm
from cadence.model.bulk_mma import MmaConfig, bulk_mma, bulk_mma_norm, bulk_plan, bulk_plan_listed
from cadence.model.fused_ops import norm_and_project, silu_and_mul
from cadence.model.moe import Experts

__all__ = ["FP8_MAX", "Fp8Linear", "KeepList", "kept_unquantized", "quantize_model_fp8",
           "quantize_rows"]

logger = logging.getLogger(__name__)

FP8_MAX = 448.0  # the largest finite float8_e4m3fn
FP8 = torch.float8_e4m3fn
# The projections that run in FP8 (module names inside a decoder layer).
_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
# Up to this many rows the weight-only kernel wins: the weight read dominates (measured on
# the H200; the activation quantization and cuBLASLt's FP8 GEMM cost more at a few rows).
WEIGHT_ONLY_MAX_ROWS = 16


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)`` with ``q * scale ~= x`` row by row: ``scale = amax(|row|) / 448`` (float32,
    shape ``[rows]``; an all-zero row gets a tiny positive scale), ``q`` in e4m3."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
    q = (xf / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def fp8_supported(device: torch.device) -> bool:
    """FP8 tensor-core GEMMs need compute capability 8.9 (Ada) or newer; the CPU emulates."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 9)


class Fp8Linear(nn.Module):
    """``x @ W.T + b`` with ``W`` held as e4m3 values and one float32 scale per output row."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 out_dtype: torch.dtype) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.out_dtype = out_dtype
        self.weight = nn.Parameter(weight, requires_grad=False)  # [N, K] e4m3
        self.weight_scale = nn.Parameter(scale.float(), requires_grad=False)  # [N]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        # .to(device) moves every tensor, but .to(dtype) / .half() must not convert the e4m3
        # weight, its float32 scales or the bias: each keeps its dtype and takes only the move.
        # The output dtype stays the one the layer was quantized for.
        def keep_dtype(t: torch.Tensor) -> torch.Tensor:
            out = fn(t)
            return out if out.dtype == t.dtype else t.to(out.device)

        self.__dict__.pop("_bulk_plans", None)  # new parameters
        return super()._apply(keep_dtype, recurse)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        q, scale = quantize_rows(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(q, scale, bias, linear.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        cfg = self._bulk_plan(x2, "plain")
        if isinstance(cfg, BulkConfig):
            return bulk_gemv(x2, self.weight, cfg, scale=self.weight_scale).view(
                *shape[:-1], self.out_features)
        if cfg is not None:
            return bulk_mma(x2, self.weight, cfg, scale=self.weight_scale).view(
                *shape[:-1], self.out_features)
        if not x2.is_cuda:
            out = self._emulated(x2)
        elif x2.shape[0] <= WEIGHT_ONLY_MAX_ROWS:
            out = fp8_kernels.weight_only_linear(x2, self.weight, self.weight_scale)
        else:
            out = self._scaled_mm(x2)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*shape[:-1], self.out_features)

    def forward_glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``forward(silu_and_mul(gate_up))``: SwiGLU in the bulk kernel's prologue where its
        table lists the call (weights in e4m3, activations in bfloat16, as the weight-only
        kernel)."""
        x2 = gate_up.reshape(-1, gate_up.shape[-1])
        cfg = self._bulk_plan(x2, "glu")
        if cfg is None:
            return self(silu_and_mul(gate_up))
        if isinstance(cfg, BulkConfig):
            return bulk_gemv(x2, self.weight, cfg, glu=True, scale=self.weight_scale).view(
                *gate_up.shape[:-1], self.out_features)
        return bulk_mma(x2, self.weight, cfg, glu=True, scale=self.weight_scale).view(
            *gate_up.shape[:-1], self.out_features)

    def forward_norm(self, x: torch.Tensor, residual: torch.Tensor | None,
                     norm_weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(forward(h), s)`` for ``h, s = add_rms_norm(x, residual, norm_weight, eps)`` (as
        ``SkinnyLinear.forward_norm``): one bulk launch where its table lists the call, with
        ``h`` the RMSNorm kernel's bits; else the two calls."""
        x2 = x.reshape(-1, x.shape[-1])
        r2 = None if residual is None else residual.reshape(x2.shape)
        cfg = self._bulk_plan(x2, "norm", r2, norm_weight)
        if cfg is None:
            return norm_and_project(self, x, residual, norm_weight, eps)
        if isinstance(cfg, BulkConfig):
            out, s = bulk_gemv_norm(x2, r2, norm_weight, eps, self.weight, cfg,
                                    self.weight_scale)
        else:
            out, s = bulk_mma_norm(x2, r2, norm_weight, eps, self.weight, cfg,
                                   self.weight_scale)
        return out.view(*x.shape[:-1], self.out_features), s.view(x.shape)

    def _bulk_plan(self, x2: torch.Tensor, mode: str, residual: torch.Tensor | None = None,
                   norm_weight: torch.Tensor | None = None) -> BulkConfig | MmaConfig | None:
        """The bulk kernel's configuration for this call, resolved once per kind of call: the
        tensor-core one where its table lists the row count, else for one row the GEMV."""
        if not (x2.is_cuda and bulk_plan_listed(self.weight, mode, x2.shape[0])):
            return None
        plans = self.__dict__.setdefault("_bulk_plans", {})
        key = (mode, x2.shape[0], x2.is_contiguous(), x2.data_ptr() & 15, torch.is_grad_enabled(),
               None if residual is None else (residual.data_ptr() & 15, residual.is_contiguous(),
                                              residual.dtype),
               None if norm_weight is None else norm_weight.data_ptr(),
               self.weight.data_ptr(), self.weight_scale.data_ptr())
        if key not in plans:
            plans[key] = bulk_plan(x2, self.weight, self.bias, mode, self.weight_scale, residual,
                                   norm_weight)
        return plans[key]

    def _scaled_mm(self, x: torch.Tensor) -> torch.Tensor:
        xq, xs = fp8_kernels.quantize_tokens(x)
        # NOTE: row-wise scaling produces bfloat16 only; other model dtypes convert after.
        # The right operand: [K, N] column-major, i.e. the weight transposed (a view); its
        # row-wise scales as [1, N] (views taken per call, so .to() and friends stay safe).
        out = torch._scaled_mm(xq, self.weight.t(), scale_a=xs.view(-1, 1),
                               scale_b=self.weight_scale.view(1, -1), out_dtype=torch.bfloat16)
        return out if self.out_dtype == torch.bfloat16 else out.to(self.out_dtype)

    def _emulated(self, x: torch.Tensor) -> torch.Tensor:
        xq, xs = quantize_rows(x)
        acc = xq.float() @ self.weight.float().t()
        return (acc * xs.unsqueeze(1) * self.weight_scale).to(self.out_dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8_e4m3"


def _quantize_experts(w: nn.Parameter) -> tuple[nn.Parameter, nn.Parameter]:
    """Experts' weights ``[E, rows, K]`` in e4m3 and their row scales ``[E, rows]``."""
    e, rows, k = w.shape
    q, scale = quantize_rows(w.detach().reshape(e * rows, k))
    return (nn.Parameter(q.view(e, rows, k), requires_grad=False),
            nn.Parameter(scale.view(e, rows), requires_grad=False))


# A fused projection's parts as checkpoints name them (Phi-3's store the fused one itself).
_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_EXPERT_PARTS = ("gate_proj", "up_proj", "down_proj")


class KeepList:
    """The modules an FP8 checkpoint keeps in a float dtype: entries that name a module by a run
    of whole dotted parts of its name ("lm_head", "down_proj", "model.layers.0.mlp", the whole
    name), or ``re:PATTERN`` entries matched at its start (transformers' and compressed-tensors'
    form)."""

    def __init__(self, entries: tuple[str, ...]) -> None:
        self.names = frozenset(e for e in entries if not e.startswith("re:"))
        self.patterns = [re.compile(e[3:]) for e in entries if e.startswith("re:")]
        self.experts_listed = any("experts." in e for e in entries)

    def __bool__(self) -> bool:
        return bool(self.names or self.patterns)

    def names_module(self, name: str) -> bool:
        parts = name.split(".")
        runs = {".".join(parts[i:j]) for i in range(len(parts))
                for j in range(i + 1, len(parts) + 1)}
        return bool(runs & self.names) or any(p.match(name) for p in self.patterns)


def kept_unquantized(name: str, keep: KeepList, num_experts: int = 0) -> bool:
    """Whether the checkpoint keeps module ``name`` (an FP8 projection here) in a float dtype:
    it is listed, or a part of it is (a fused projection's q / k / v or gate / up, one of a
    layer's ``num_experts`` experts). NOTE: a part listed keeps the whole weight in float (it
    is one weight here), the closest to what the checkpoint holds."""
    if not keep:
        return False
    if keep.names_module(name):
        return True
    parent, _, leaf = name.rpartition(".")
    if num_experts:
        if not keep.experts_listed and not keep.patterns:
            return False
        parts = [f"{name}.{i}.{p}" for i in range(num_experts) for p in _EXPERT_PARTS]
    else:
        parts = [f"{parent}.{p}" for p in _PARTS.get(leaf, ())]
    hits = [keep.names_module(part) for part in parts]
    if any(hits) and not all(hits):
        logger.warning("fp8: the checkpoint keeps some parts of %s in float (%d of %d): the "
                       "whole weight stays in the model dtype", name, sum(hits), len(hits))
    return any(hits)


@torch.no_grad()
def quantize_model_fp8(model: nn.Module) -> int:
    """Replace the decoder projections of ``model`` by their ``Fp8Linear`` and turn MoE experts
    into e4m3 with row scales; the number of modules changed.

    On CUDA a projection whose sizes are not multiples of 16 (the FP8 GEMM's granularity)
    stays in the model dtype, as do the modules an FP8 checkpoint keeps unquantized
    (``model.arch.quant_ignored``)."""
    replaced = kept = skipped = 0
    keep = KeepList(getattr(getattr(model, "arch", None), "quant_ignored", ()))
    for path, module in list(model.named_modules()):
        if isinstance(module, Experts):
            if kept_unquantized(path, keep, module.gate_up_proj.shape[0]):
                skipped += 1
                continue
            module.gate_up_proj, module.gate_up_scale = _quantize_experts(module.gate_up_proj)
            module.down_proj, module.down_scale = _quantize_experts(module.down_proj)
            replaced += 1
            continue
        for child_name, child in list(module.named_children()):
            if child_name not in _PROJECTIONS or not isinstance(child, nn.Linear):
                continue
            if kept_unquantized(f"{path}.{child_name}" if path else child_name, keep):
                skipped += 1
                continue
            n, k = child.weight.shape
            if child.weight.is_cuda and (n % 16 or k % 16):
                kept += 1
                continue
            setattr(module, child_name, Fp8Linear.from_linear(child))
            replaced += 1
    if skipped:
        logger.info("fp8: %d projections or expert layers the checkpoint keeps unquantized stay "
                    "in the model dtype", skipped)
    if kept:
        logger.warning("fp8: %d projections whose sizes are not multiples of 16 stay in the "
                       "model dtype", kept)
    if replaced and next(model.parameters()).is_cuda:
        torch.cuda.empty_cache()  # the model-dtype weights just freed return to the device
    return replaced
