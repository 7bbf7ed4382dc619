"""FP8 checkpoints (``quantization_config.quant_method == "fp8"``): e4m3 weights with block-wise
scales (``<name>_scale_inv``, as transformers and DeepSeek/Qwen write them) or per-tensor /
per-output-channel scales (``<name>_scale``, vLLM's serialized form), dequantized into the
model dtype at load. The engine then runs in that dtype, or where the GPU has FP8 tensor cores
requantizes the projections, all but those the config keeps unquantized (``modules_to_not_convert``
as transformers writes it, ``ignored_layers`` as vLLM's; their weights are stored in a float
dtype). A static scheme's ``input_scale`` is read and checked but not used: activations are
quantized per token at run time."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["FP8_DTYPE", "Fp8Checkpoint", "Fp8Scales", "check_scale", "dequantize", "scale_owner"]

FP8_DTYPE = "F8_E4M3"  # safetensors' name of torch.float8_e4m3fn
_SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale", "input_scale")


@dataclass(frozen=True)
class Fp8Checkpoint:
    """What an FP8 checkpoint's quantization_config says about its weights."""

    block: tuple[int, int] | None  # (rows, columns) of a scale block; None: per tensor/channel
    # Modules kept in a float dtype (names or dotted parts of names, HF's: "lm_head",
    # "model.layers.0.mlp.down_proj", "down_proj"; or "re:PATTERN"): read by fp8.KeepList.
    ignored: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, quant: Any) -> Fp8Checkpoint:
        get = quant.get if isinstance(quant, dict) else lambda k, d=None: getattr(quant, k, d)
        fmt = get("fmt", "e4m3") or "e4m3"
        if fmt != "e4m3":
            raise ValueError(f"FP8 checkpoint format {fmt!r} is not supported; supported: e4m3.")
        block = get("weight_block_size", None)
        if block is not None:
            sizes = block if isinstance(block, list | tuple) else [block]
            if len(sizes) != 2 or not all(type(n) is int and n >= 1 for n in sizes):
                raise ValueError(f"weight_block_size must be two positive sizes, got {block!r}.")
            block = (sizes[0], sizes[1])
        scheme = get("activation_scheme", None)
        if scheme is not None and scheme not in ("dynamic", "static"):
            raise ValueError(f"activation_scheme {scheme!r} is not an FP8 activation scheme; "
                             "supported: dynamic, static.")
        ignored: list[str] = []
        for key in ("modules_to_not_convert", "ignored_layers"):
            names = get(key, None)
            if names is None:
                continue
            if not isinstance(names, list | tuple) or not all(
                    isinstance(n, str) and n for n in names):
                raise ValueError(f"quantization_config.{key} must be a list of module names, "
                                 f"got {names!r}.")
            for entry in names:
                if entry.startswith("re:"):
                    try:
                        re.compile(entry[3:])
                    except re.error as exc:
                        raise ValueError(f"quantization_config.{key}: {entry!r} is not a "
                                         f"regular expression ({exc}).") from None
            ignored.extend(names)
        return cls(block, tuple(dict.fromkeys(ignored)))

    @staticmethod
    def is_scale(name: str) -> bool:
        return name.endswith(_SCALE_SUFFIXES)


def check_scale(name: str, scale: torch.Tensor) -> torch.Tensor:
    """``scale`` in float32, refused unless it is floating point, finite and positive."""
    if not scale.is_floating_point():
        raise ValueError(f"tensor {name!r} has dtype {scale.dtype}; a scale is floating point.")
    scale = scale.to(torch.float32)
    bad = scale[~(torch.isfinite(scale) & (scale > 0))]
    if bad.numel():
        raise ValueError(f"tensor {name!r}: a scale must be positive and finite, got "
                         f"{float(bad[0])}.")
    return scale


def dequantize(weight: torch.Tensor, name: str,
               read_scale: Callable[[str], torch.Tensor | None],
               block: tuple[int, ...]) -> torch.Tensor:
    """The float32 value of FP8 weight ``name`` (``read_scale(name)``: a scale tensor of the
    checkpoint, from whichever file holds it, or None; ``block``: the config's
    weight_block_size, for block-wise scales)."""
    weight = weight.to(torch.float32)
    scale = read_scale(name + "_scale_inv")
    if scale is not None and read_scale(name + "_scale") is not None:
        raise ValueError(f"FP8 tensor {name!r} has two scales ({name}_scale_inv and "
                         f"{name}_scale); a checkpoint stores one.")
    if scale is not None:  # block-wise: one scale per block of the weight
        scale = check_scale(name + "_scale_inv", scale)
        rows, cols = weight.shape
        if len(block) != 2:
            raise ValueError(f"tensor {name + '_scale_inv'!r} is a block-wise scale, but the "
                             "quantization_config has no weight_block_size.")
        block_r, block_c = block
        if list(scale.shape) != [-(-rows // block_r), -(-cols // block_c)]:
            raise ValueError(f"tensor {name + '_scale_inv'!r} of shape {list(scale.shape)} does not "
                             f"tile weight {name!r} of shape {list(weight.shape)} in "
                             f"{block_r}x{block_c} blocks.")
        full = scale.repeat_interleave(block_r, 0)[:rows].repeat_interleave(block_c, 1)[:, :cols]
        return weight * full
    scale = read_scale(name + "_scale")
    if scale is not None:  # per tensor or per output channel
        scale = check_scale(name + "_scale", scale)
        if scale.numel() == 1:
            return weight * scale.reshape(())
        if scale.numel() == weight.shape[0]:
            return weight * scale.reshape(-1, 1)
        raise ValueError(f"tensor {name + '_scale'!r} has {scale.numel()} values; expected 1 or "
                         f"{weight.shape[0]} (one per output channel) for {name!r}.")
    raise ValueError(f"FP8 tensor {name!r} has no scale ({name}_scale_inv or {name}_scale).")


def scale_owner(name: str) -> str:
    """The weight a scale tensor belongs to (``...o_proj.weight_scale_inv`` and
    ``...o_proj.input_scale``: ``...o_proj.weight``)."""
    for suffix in _SCALE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)] + "weight"
    raise ValueError(f"{name!r} is not a scale tensor.")


class Fp8Scales:
    """An fp8 checkpoint's scale tensors (in any of its open files ``handles``), checked before
    any weight is read: each belongs to an FP8 weight of the checkpoint, and a static scheme's
    ``input_scale`` is one positive number. Each weight's scale is read as it is dequantized."""

    def __init__(self, handles: list[Any], block: tuple[int, ...]) -> None:
        self.block = block
        self.where = {n: f for f in handles for n in f.keys() if Fp8Checkpoint.is_scale(n)}
        dtypes = {n: f.get_slice(n).get_dtype() for f in handles for n in f.keys()
                  if not Fp8Checkpoint.is_scale(n)}
        for name in sorted(self.where):
            owner = scale_owner(name)
            if owner not in dtypes:
                raise ValueError(f"unexpected tensor {name!r}: a scale of {owner!r}, which the "
                                 "checkpoint does not hold.")
            if dtypes[owner] != FP8_DTYPE:
                raise ValueError(f"unexpected tensor {name!r}: a scale of {owner!r}, which is "
                                 f"stored in {dtypes[owner]}, not {FP8_DTYPE}.")
            if name.endswith("input_scale"):
                scale = check_scale(name, self.where[name].get_tensor(name))
                if scale.numel() != 1:
                    raise ValueError(f"tensor {name!r}: an input scale is one number, got "
                                     f"shape {list(scale.shape)}.")

    def read(self, name: str) -> torch.Tensor | None:
        f = self.where.get(name)
        return None if f is None else f.get_tensor(name)

    def dequantize(self, name: str, weight: torch.Tensor) -> torch.Tensor:
        return dequantize(weight, name, self.read, self.block)
