"""Build a CausalLM and fill its weights from safetensors checkpoints, or with dummy values."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

import torch
from safetensors import safe_open

from cadence.model.arch import DecoderArch
from cadence.model.attention_metadata import AttentionBackend
from cadence.model.decoder import CausalLM
from cadence.model.fp8 import fp8_supported, quantize_model_fp8
from cadence.model.fp8_checkpoint import FP8_DTYPE, Fp8Checkpoint, Fp8Scales
from cadence.model.parallel import TPShard
from cadence.model.registry import ModelSpec

LOAD_FORMATS = ("auto", "safetensors", "dummy")
_DUMMY_STD = 0.02
_SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)
# safetensors' names of the dtypes a checkpoint tensor may have (cast to the model dtype).
_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


def build_model(
    spec: ModelSpec,
    dtype: torch.dtype,
    device: torch.device | str,
    load_format: str,
    attn_backend: AttentionBackend,
    seed: int,
    tp_rank: int = 0,
    tp_size: int = 1,
    quantization: str | None = None,
) -> CausalLM:
    """Allocate the model once, directly on ``device`` in ``dtype``, then fill its weights
    (with ``tp_size > 1``, only rank ``tp_rank``'s shards of them); ``quantization="fp8"``
    then turns the decoder projections into FP8 (as an FP8 checkpoint does on a GPU that has
    FP8 tensor cores)."""
    check_load_format(spec, load_format)
    device = torch.device(device)
    with torch.device("meta"):
        model = CausalLM(spec.hf_config, attn_backend, tp_rank, tp_size)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.reset_buffers()
    if model.shard is not None:
        # Shards leave some of their memory unloaded (the padded vocabulary rows, row-parallel
        # biases of ranks > 0): it must read as zero.
        for param in model.parameters():
            param.detach().zero_()
    if load_format == "dummy":
        init_dummy_weights(model, seed)
    else:
        assert spec.path is not None
        load_safetensors(model, spec.path)
    model = model.eval().requires_grad_(False)
    model.order_rotary_dims()
    quant = effective_quantization(model, quantization, device)
    if quant == "fp8":
        if not fp8_supported(device):
            raise ValueError(f"quantization='fp8' needs FP8 tensor cores (compute capability "
                             f"8.9 or newer); {torch.cuda.get_device_name(device)} has "
                             f"{torch.cuda.get_device_capability(device)}.")
        quantize_model_fp8(model)
    return model


def effective_quantization(model: CausalLM, quantization: str | None,
                           device: torch.device) -> str | None:
    """The quantization a model runs with: ``quantization`` when given, else an FP8
    checkpoint's own on a GPU with FP8 tensor cores (elsewhere it was dequantized at load)."""
    if quantization is None and model.arch.quantization == "fp8" and device.type == "cuda":
        return "fp8" if fp8_supported(device) else None
    return quantization


def check_load_format(spec: ModelSpec, load_format: str) -> None:
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}.")
    if spec.is_preset and load_format != "dummy":
        raise ValueError(
            f"load_format={load_format!r} needs weights, but this model is a shape preset "
            "without weights; use load_format='dummy'."
        )


@torch.no_grad()
def init_dummy_weights(model: CausalLM, seed: int) -> None:
    """Seeded random weights generated on the parameters' device: N(0, 0.02) for matrices and
    embeddings, unit norm scales (weight 1, or 0 for Gemma's (1 + w) norms), zeros for biases."""
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(0.0 if model.arch.gemma else 1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            gen = generators.get(param.device)
            if gen is None:
                gen = generators[param.device] = torch.Generator(param.device).manual_seed(seed)
            param.normal_(0.0, _DUMMY_STD, generator=gen)


@dataclass(frozen=True)
class _Target:
    """Where one checkpoint tensor goes: a parameter and the row range inside it; under tensor
    parallelism, also which part of the tensor this rank reads."""

    param: str
    row_start: int
    num_rows: int | None  # None: the whole parameter
    expert: int | None = None  # the index into the parameter's first dimension, first
    # The slice [src_start, src_start + src_len) of dimension src_dim (None: the whole tensor),
    # whose full extent is src_total.
    src_dim: int | None = None
    src_start: int = 0
    src_len: int = 0
    src_total: int = 0
    skip: bool = False  # another rank holds it (a row-parallel bias): leave the zeros


def checkpoint_files(path: str) -> list[str]:
    """The safetensors files of a checkpoint directory (sharded index or single file)."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        return [os.path.join(path, name) for name in _indexed_files(index)]
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    found = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not found:
        pickled = any(f.endswith((".pt", ".pth")) or (f.endswith(".bin") and "model" in f)
                      for f in os.listdir(path))
        raise ValueError(f"no safetensors weights (*.safetensors) found in {path!r}" + (
            "; PyTorch pickle checkpoints (.bin, .pt, .pth) are not loaded: convert them to "
            "safetensors." if pickled else "."))
    return [os.path.join(path, name) for name in found]


def _indexed_files(index: str) -> list[str]:
    """The shard files a ``model.safetensors.index.json`` maps tensors to."""
    try:
        with open(index, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{index} is not a readable JSON index: {exc}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) and v and os.path.basename(v) == v for v in weight_map.values()):
        raise ValueError(f"{index}: its weight_map must map tensor names to shard file names "
                         "in the checkpoint's directory.")
    return sorted(set(weight_map.values()))


def checkpoint_names(arch: DecoderArch, shard: TPShard | None = None
                     ) -> dict[str, _Target | list[_Target]]:
    """Every tensor a checkpoint of this architecture must hold, mapped to its destination.
    With a ``shard``, ``arch`` has the rank's shapes and the targets slice the tensors."""
    names: dict[str, _Target] = {}
    if shard is not None:
        return sharded_names(arch, shard, checkpoint_names(arch))

    def whole(name: str) -> None:
        names[name] = _Target(name, 0, None)

    def fused(prefix: str, dest: str, shards: dict[str, tuple[int, int]], bias: bool) -> None:
        for suffix in ("weight", "bias") if bias else ("weight",):
            for shard, (start, rows) in shards.items():
                names[f"{prefix}.{shard}_proj.{suffix}"] = _Target(
                    f"{prefix}.{dest}.{suffix}", start, rows
                )

    q, kv, inter = arch.q_size, arch.kv_size, arch.intermediate_size
    qkv_rows = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}
    gate_up_rows = {"gate": (0, inter), "up": (inter, inter)}
    whole("model.embed_tokens.weight")
    whole("model.norm.weight")
    if not arch.tie_word_embeddings:
        whole("lm_head.weight")
    for i in range(arch.num_layers):
        layer = f"model.layers.{i}"
        whole(f"{layer}.input_layernorm.weight")
        whole(f"{layer}.post_attention_layernorm.weight")
        if arch.gemma:
            whole(f"{layer}.pre_feedforward_layernorm.weight")
            whole(f"{layer}.post_feedforward_layernorm.weight")
        if arch.qk_norm:
            whole(f"{layer}.self_attn.q_norm.weight")
            whole(f"{layer}.self_attn.k_norm.weight")
        if arch.fused_checkpoint:
            whole(f"{layer}.self_attn.qkv_proj.weight")
        else:
            fused(f"{layer}.self_attn", "qkv_proj", qkv_rows, arch.qkv_bias)
        whole(f"{layer}.self_attn.o_proj.weight")
        if arch.o_bias:
            whole(f"{layer}.self_attn.o_proj.bias")
        if arch.is_moe_layer(i):
            whole(f"{layer}.mlp.gate.weight")
            inter = arch.moe_intermediate_size
            for e in range(arch.num_experts):
                expert = f"{layer}.mlp.experts.{e}"
                gate_up = f"{layer}.mlp.experts.gate_up_proj"
                names[f"{expert}.gate_proj.weight"] = _Target(gate_up, 0, inter, e)
                names[f"{expert}.up_proj.weight"] = _Target(gate_up, inter, inter, e)
                names[f"{expert}.down_proj.weight"] = _Target(
                    f"{layer}.mlp.experts.down_proj", 0, None, e
                )
            continue
        if arch.fused_checkpoint:
            whole(f"{layer}.mlp.gate_up_proj.weight")
        else:
            fused(f"{layer}.mlp", "gate_up_proj", gate_up_rows, arch.mlp_bias)
        whole(f"{layer}.mlp.down_proj.weight")
        if arch.mlp_bias:
            whole(f"{layer}.mlp.down_proj.bias")
    return names


def sharded_names(arch: DecoderArch, shard: TPShard, plain: dict[str, _Target]
                  ) -> dict[str, _Target | list[_Target]]:
    """The targets of one tensor-parallel rank: ``plain`` (the rank's shapes, whole tensors)
    with each split tensor's slice of the checkpoint."""
    hd, r = arch.head_dim, shard.rank
    q, kv, dense_inter = arch.q_size, arch.kv_size, arch.intermediate_size
    vocab = arch.vocab_size
    vocab_rows = max(0, min(shard.vocab_per_rank, vocab - shard.vocab_start))
    out: dict[str, _Target | list[_Target]] = {}
    for name, t in plain.items():
        kind = name.rsplit(".", 2)[-2]
        # An expert's channels split like a dense MLP's, over its own intermediate size.
        inter = arch.moe_intermediate_size if ".experts." in name else dense_inter
        if kind in ("q_proj", "gate_proj", "up_proj"):
            size = q if kind == "q_proj" else inter
            t = replace(t, src_dim=0, src_start=r * size, src_len=size,
                        src_total=size * shard.size)
        elif kind in ("k_proj", "v_proj"):
            t = replace(t, src_dim=0, src_start=shard.kv_head_start * hd, src_len=kv,
                        src_total=shard.full_kv_heads * hd)
        elif kind in ("o_proj", "down_proj"):
            if name.endswith(".bias"):
                t = replace(t, skip=r != 0)
            else:
                size = q if kind == "o_proj" else inter
                t = replace(t, src_dim=1, src_start=r * size, src_len=size,
                            src_total=size * shard.size)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            t = replace(t, num_rows=vocab_rows, src_dim=0, src_start=shard.vocab_start,
                        src_len=vocab_rows, src_total=vocab)
        elif kind == "qkv_proj" and arch.fused_checkpoint:  # Phi-3: [q | k | v] in one tensor
            q_all, kv_all = q * shard.size, shard.full_kv_heads * hd
            kv_from = shard.kv_head_start * hd
            out[name] = [replace(t, row_start=dst, num_rows=n, src_dim=0, src_start=src,
                                 src_len=n, src_total=q_all + 2 * kv_all)
                         for dst, src, n in ((0, r * q, q), (q, q_all + kv_from, kv),
                                             (q + kv, q_all + kv_all + kv_from, kv))]
            continue
        elif kind == "gate_up_proj" and arch.fused_checkpoint:  # Phi-3: [gate | up]
            inter_all = inter * shard.size
            out[name] = [replace(t, row_start=dst, num_rows=inter, src_dim=0, src_start=src,
                                 src_len=inter, src_total=2 * inter_all)
                         for dst, src in ((0, r * inter), (inter, inter_all + r * inter))]
            continue
        out[name] = t
    return out


def _open_checkpoint(file: str) -> Any:
    """``safe_open`` of one checkpoint file; a file that is not safetensors is a ValueError
    naming it."""
    try:
        return safe_open(file, framework="pt", device="cpu")
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error type
        raise ValueError(f"{file} is not a readable safetensors file: {exc}") from None


@torch.no_grad()
def load_safetensors(model: CausalLM, path: str) -> None:
    """Copy every checkpoint tensor into the already-allocated parameters, one at a time.

    Files are memory-mapped; no full host copy of the checkpoint is made.
    """
    params = dict(model.named_parameters())
    expected = checkpoint_names(model.arch, model.shard)
    fp8 = model.arch.quantization == "fp8"
    files = checkpoint_files(path)
    loaded: set[str] = set()
    with ExitStack() as stack:  # every file opened once (memory-mapped: nothing read yet)
        handles = [stack.enter_context(_open_checkpoint(file)) for file in files]
        scales = Fp8Scales(handles, model.arch.quant_block) if fp8 else None
        read_scale = scales.dequantize if scales is not None else None
        for file, f in zip(files, handles, strict=True):
            for name in f.keys():
                if name.endswith(_SKIPPED_SUFFIXES) or (fp8 and Fp8Checkpoint.is_scale(name)):
                    continue
                if name == "lm_head.weight" and model.arch.tie_word_embeddings:
                    continue  # some tied checkpoints still store the (identical) head
                if _load_kv_scale(model, f, name):
                    continue
                target = expected.get(name)
                if target is None:
                    raise ValueError(
                        f"unexpected tensor {name!r} in {os.path.basename(file)} for "
                        f"{model.arch.architecture}."
                    )
                loaded.add(name)
                # A fused tensor split over tensor-parallel ranks fills several row ranges.
                for part in target if isinstance(target, list) else [target]:
                    if not part.skip:
                        _load_one(f, name, part, params[part.param], read_scale)
    missing = [name for name in expected if name not in loaded]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"checkpoint {path!r} is missing tensor {missing[0]!r}{more}.")


_KV_SCALE = re.compile(
    r"model\.layers\.(\d+)\.self_attn\.(?:(k|v|kv)_scale|([kv])_proj\.output_scale)")


def _load_kv_scale(model: CausalLM, f, name: str) -> bool:
    """A checkpoint's per-layer FP8 KV-cache scale (``self_attn.k_scale`` / ``v_scale``, the
    older ``k_proj.output_scale`` / ``v_proj.output_scale``, or one ``kv_scale`` for both) into
    its attention layer; False
    when ``name`` is not one. The scales act only on an FP8 cache."""
    found = _KV_SCALE.fullmatch(name)
    if found is None:
        return False
    layer, which = int(found.group(1)), found.group(2) or found.group(3)
    if layer >= model.arch.num_layers:
        raise ValueError(f"tensor {name!r}: a KV-cache scale of layer {layer}, but the model "
                         f"has {model.arch.num_layers} layers.")
    scale = f.get_tensor(name).float()
    if scale.numel() != 1:
        raise ValueError(f"tensor {name!r}: a KV-cache scale is one number, got shape "
                         f"{list(scale.shape)}.")
    if not (math.isfinite(float(scale)) and float(scale) > 0):
        raise ValueError(f"tensor {name!r}: a KV-cache scale must be positive and finite, got "
                         f"{float(scale)}.")
    # The older single ``kv_scale`` serves keys and values alike.
    for kv in ("k", "v") if which == "kv" else (which,):
        setattr(model.model.layers[layer].self_attn, f"{kv}_scale", float(scale))
    return True


def _load_one(f, name: str, target: _Target, param: torch.Tensor,
              fp8: Callable[[str, torch.Tensor], torch.Tensor] | None = None) -> None:
    """Copy one checkpoint tensor (or this rank's slice of it) from the open file ``f`` into
    its destination; only the slice is read from the memory-mapped file (an FP8 weight of an
    fp8 checkpoint is read whole and dequantized by ``fp8``)."""
    tensor_slice = f.get_slice(name)
    if target.expert is not None:
        param = param[target.expert]
    dest = param if target.num_rows is None else param.narrow(0, target.row_start,
                                                              target.num_rows)
    found = list(tensor_slice.get_shape())
    expected = list(dest.shape)
    if target.src_dim is not None:
        expected[target.src_dim] = target.src_total
    if found != expected:
        raise ValueError(f"tensor {name!r} has shape {found}; expected {expected}.")
    stored = tensor_slice.get_dtype()
    if stored == FP8_DTYPE and fp8 is not None:
        tensor_slice = fp8(name, f.get_tensor(name))  # sliced below like the file's tensor
        if target.src_dim is None:
            dest.copy_(tensor_slice)
            return
    elif stored not in _FLOAT_DTYPES:
        raise ValueError(
            f"tensor {name!r} has dtype {stored}; expected a floating-point dtype "
            f"({', '.join(_FLOAT_DTYPES)}; {FP8_DTYPE} in fp8 checkpoints), converted to "
            f"{dest.dtype} at load."
        )
    if target.src_dim is None:
        dest.copy_(f.get_tensor(name))
        return
    end = target.src_start + target.src_len
    if target.src_dim == 0:
        dest.copy_(tensor_slice[target.src_start:end])
    else:
        dest.copy_(tensor_slice[:, target.src_start:end])
