"""FP8 checkpoints (``quantization_config.quant_method == "fp8"``): e4m3 weights with block-wise
scales (``<name>_scale_inv``, as transformers and DeepSeek/Qwen write them) or per-tensor /
per-output-channel scales (``<name>_scale``, vLLM's serialized form), dequantized into the
model dtype at load. The engine then runs in that dtype: no FP8 compute."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["FP8_DTYPE", "Fp8Checkpoint", "dequantize"]

FP8_DTYPE = "F8_E4M3"  # safetensors' name of torch.float8_e4m3fn
_SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale", "input_scale")


@dataclass(frozen=True)
class Fp8Checkpoint:
    """What an FP8 checkpoint's quantization_config says about its weights."""

    block: tuple[int, int] | None  # (rows, columns) of a scale block; None: per tensor/channel

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
        return cls(block)

    @staticmethod
    def is_scale(name: str) -> bool:
        return name.endswith(_SCALE_SUFFIXES)


def dequantize(weight: torch.Tensor, name: str,
               read_scale: Callable[[str], torch.Tensor | None],
               block: tuple[int, ...]) -> torch.Tensor:
    """The float32 value of FP8 weight ``name`` (``read_scale(name)``: a scale tensor of the
    checkpoint, from whichever file holds it, or None; ``block``: the config's
    weight_block_size, for block-wise scales)."""
    weight = weight.to(torch.float32)
    scale = read_scale(name + "_scale_inv")
    if scale is not None:  # block-wise: one scale per block of the weight
        scale = scale.to(torch.float32)
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
        scale = scale.to(torch.float32)
        if scale.numel() == 1:
            return weight * scale.reshape(())
        if scale.numel() == weight.shape[0]:
            return weight * scale.reshape(-1, 1)
        raise ValueError(f"tensor {name + '_scale'!r} has {scale.numel()} values; expected 1 or "
                         f"{weight.shape[0]} (one per output channel) for {name!r}.")
    raise ValueError(f"FP8 tensor {name!r} has no scale ({name}_scale_inv or {name}_scale).")
