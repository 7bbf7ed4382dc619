"""Resolve a ``model`` argument (``"tiny"``, a preset name or an HF directory) into a ModelSpec."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from cadence.model.arch import DecoderArch
from cadence.model.generation_config import generation_defaults
from cadence.model.presets import PRESETS, preset_config
from cadence.model.rope import context_length
from cadence.user_errors import first_line

TINY_MODEL = "tiny"
# vLLM's hf_overrides: fields set on the model's config, or a function of the config.
HfOverrides = dict[str, Any] | Callable[[PretrainedConfig], PretrainedConfig]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class ModelSpec:
    hf_config: PretrainedConfig
    path: str | None  # HF directory with weights and tokenizer; None for presets
    tokenizer_path: str | None  # None when there is no tokenizer (presets, weight-only dirs)
    architecture: str
    max_model_len: int
    eos_token_ids: list[int]
    is_preset: bool
    # Default sampling fields from the generation config (``--generation-config``).
    generation_defaults: dict[str, Any] = dataclasses.field(default_factory=dict)


def resolve_model(
    model: str, max_model_len: int | None = None, tokenizer: str | None = None,
    generation_config: str = "auto", hf_overrides: HfOverrides | None = None,
) -> ModelSpec:
    """Resolve ``model`` without any network access.

    ``"tiny"`` is the built-in model (generated on first use), a preset name gives a config
    without weights, anything else must be a local HF directory with a ``config.json``.
    ``tokenizer`` (``--tokenizer``) replaces the model's own tokenizer, if any;
    ``generation_config`` says where default sampling fields come from (``generation_config``);
    ``hf_overrides`` changes the model's config before anything is derived from it.
    """
    spec = _resolve(model, max_model_len, hf_overrides)
    defaults = generation_defaults(generation_config, spec.path)
    if defaults:
        spec = dataclasses.replace(spec, generation_defaults=defaults)
    if tokenizer is None:
        return spec
    return dataclasses.replace(spec, tokenizer_path=resolve_tokenizer(tokenizer))


def resolve_tokenizer(tokenizer: str) -> str:
    """The directory of ``--tokenizer``: ``"tiny"`` (the built-in model's) or a local directory
    with tokenizer files."""
    if tokenizer == TINY_MODEL:
        from cadence.model.tiny import ensure_tiny_model

        return str(ensure_tiny_model())
    path = Path(tokenizer).expanduser()
    if not path.is_dir():
        raise ValueError(
            f"--tokenizer {tokenizer!r} is not a directory; tokenizers are never downloaded."
        )
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise ValueError(
            f"--tokenizer directory {tokenizer!r} has no tokenizer files "
            f"({', '.join(_TOKENIZER_FILES)})."
        )
    return str(path)


def apply_hf_overrides(config: PretrainedConfig, overrides: HfOverrides | None
                       ) -> PretrainedConfig:
    """``config`` with vLLM's ``hf_overrides`` applied: a mapping sets each field (a nested
    config, such as a multimodal model's ``text_config``, is updated field by field; any other
    value, a dict included, replaces the field), a function returns the new config."""
    if overrides is None:
        return config
    if callable(overrides):
        result = overrides(config)
        if not isinstance(result, PretrainedConfig):
            raise ValueError("hf_overrides: the function must return the model's config (a "
                             f"transformers PretrainedConfig), got {type(result).__name__}.")
        return result
    overrides = _override_rope(config, overrides)
    _update(config, overrides, "hf_overrides")
    return config


def _override_rope(config: PretrainedConfig, overrides: dict[str, Any]) -> dict[str, Any]:
    """Apply the older layout's ``rope_scaling`` / ``rope_theta`` (what vLLM users write) to a
    transformers-5 config, which keeps both in ``rope_parameters`` (set as plain attributes,
    they would be ignored, or replace the parameters and lose the base); the other overrides
    are returned. Per-layer-type parameters (Gemma 3) get them on the full-attention layers, as
    the older layout applied them."""
    params = getattr(config, "rope_parameters", None)
    given = overrides.get("rope_parameters")
    if isinstance(params, dict) and isinstance(given, dict) and given and not any(
            isinstance(v, dict) for v in given.values()) and "rope_theta" not in given:
        # A flat rope_parameters without its base: the checkpoint's base stays (transformers
        # would fail on the missing key; the engine would silently rotate by 10,000).
        base = params.get("rope_theta")
        if base is None and params and all(isinstance(v, dict) for v in params.values()):
            base = (params.get("full_attention") or next(iter(params.values()))).get(
                "rope_theta")
        if base is not None:
            overrides = {**overrides, "rope_parameters": {**given, "rope_theta": base}}
    if not isinstance(params, dict) or not ({"rope_scaling", "rope_theta"} & overrides.keys()):
        return overrides
    per_layer = bool(params) and all(isinstance(v, dict) for v in params.values())
    key = "full_attention" if per_layer and "full_attention" in params else None
    if per_layer and key is None:
        key = next(iter(params))
    current = dict(params[key]) if key is not None else dict(params)
    rest = dict(overrides)
    theta = current.get("rope_theta")
    if "rope_scaling" in rest:
        scaling = rest.pop("rope_scaling")
        if scaling is not None and not isinstance(scaling, dict):
            raise ValueError(f"hf_overrides: rope_scaling must be an object or null, got "
                             f"{scaling!r}.")
        current = {"rope_type": "default"} if scaling is None else dict(scaling)
        theta = current.get("rope_theta", theta)  # a base given inside the scaling
    current["rope_theta"] = rest.pop("rope_theta", theta)
    config.rope_parameters = {**params, key: current} if key is not None else current
    return rest


def _update(target: PretrainedConfig, overrides: dict[str, Any], where: str) -> None:
    for key, value in overrides.items():
        if not isinstance(key, str) or not key.isidentifier() or key.startswith("__"):
            raise ValueError(f"{where}: field names must be identifiers, got {key!r}.")
        nested = getattr(target, key, None)
        if isinstance(nested, PretrainedConfig) and isinstance(value, dict):
            _update(nested, value, f"{where}.{key}")
            continue
        try:
            setattr(target, key, value)
        except Exception as exc:  # noqa: BLE001 - transformers' typed fields raise their own
            raise ValueError(f"{where}.{key}: {value!r} is refused by the config: "
                             f"{first_line(exc)}") from None


def _resolve(model: str, max_model_len: int | None, overrides: HfOverrides | None) -> ModelSpec:
    if model == TINY_MODEL:
        from cadence.model.tiny import ensure_tiny_model

        return _resolve_directory(str(ensure_tiny_model()), max_model_len, overrides)
    if model in PRESETS:
        config = apply_hf_overrides(preset_config(model), overrides)
        arch = DecoderArch.from_hf_config(config)
        return ModelSpec(
            hf_config=config,
            path=None,
            tokenizer_path=None,
            architecture=arch.architecture,
            max_model_len=_resolve_max_model_len(max_model_len, arch.max_position_embeddings,
                                                context_length(config)),
            eos_token_ids=_as_id_list(config.eos_token_id),
            is_preset=True,
        )
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ValueError(
            f"model {model!r} is neither a local model directory nor a known name "
            f"(known: {', '.join([TINY_MODEL, *PRESETS])}); models are never downloaded."
        )
    if not (path / "config.json").is_file():
        raise ValueError(f"model directory {model!r} has no config.json.")
    return _resolve_directory(str(path), max_model_len, overrides)


def _resolve_directory(path: str, max_model_len: int | None,
                       overrides: HfOverrides | None) -> ModelSpec:
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError and others
        raise ValueError(f"{os.path.join(path, 'config.json')} is not a model configuration "
                         f"transformers can read: {first_line(exc)}") from None
    config = apply_hf_overrides(config, overrides)
    arch = DecoderArch.from_hf_config(config)
    has_tokenizer = any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES)
    return ModelSpec(
        hf_config=config,
        path=path,
        tokenizer_path=path if has_tokenizer else None,
        architecture=arch.architecture,
        max_model_len=_resolve_max_model_len(max_model_len, arch.max_position_embeddings,
                                                context_length(config)),
        eos_token_ids=_eos_token_ids(path, config),
        is_preset=False,
    )


def _resolve_max_model_len(requested: int | None, max_position_embeddings: int,
                           limit: int) -> int:
    """``requested``, or by default ``limit``: the longest sequence the model's RoPE scaling is
    made for (``rope.context_length``; max_position_embeddings without such scaling), as vLLM
    derives its default; a request past it is refused."""
    if requested is None:
        return limit
    if requested < 1:
        raise ValueError(f"max_model_len must be at least 1, got {requested}.")
    if requested > limit:
        scaled = f", {limit} with its RoPE scaling" if limit != max_position_embeddings else ""
        raise ValueError(
            f"max_model_len ({requested}) is larger than the model's "
            f"max_position_embeddings ({max_position_embeddings}{scaled})."
        )
    return requested


def _eos_token_ids(path: str, config: PretrainedConfig) -> list[int]:
    generation_config = os.path.join(path, "generation_config.json")
    if os.path.isfile(generation_config):
        try:
            with open(generation_config, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, UnicodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{generation_config} cannot be read as JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{generation_config}: expected a JSON object, got "
                             f"{type(data).__name__}.")
        eos = data.get("eos_token_id")
        if eos is not None:
            return _as_id_list(eos, f"{generation_config}: eos_token_id")
    return _as_id_list(getattr(config, "eos_token_id", None),
                       f"{os.path.join(path, 'config.json')}: eos_token_id")


def _as_id_list(value: object, where: str = "eos_token_id") -> list[int]:
    """An end id or a list of them, as non-negative integers (a one-line error otherwise)."""
    if value is None:
        return []
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"{where}: expected a token id or a list of them, got {value!r}.")
    return list(dict.fromkeys(ids))
