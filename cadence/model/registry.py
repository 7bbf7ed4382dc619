"""Resolve a ``model`` argument (``"tiny"``, a preset name or an HF directory) into a ModelSpec."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from cadence.config import AUTO_MAX_MODEL_LEN
from cadence.hf_overrides import HfOverrides, apply_hf_overrides
from cadence.model.arch import DecoderArch
from cadence.model.generation_config import generation_defaults
from cadence.model.presets import PRESETS, preset_config
from cadence.model.rope import context_length
from cadence.user_errors import first_line

TINY_MODEL = "tiny"
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
    override_generation_config: dict[str, Any] | None = None,
) -> ModelSpec:
    """Resolve ``model`` without any network access.

    ``"tiny"`` is the built-in model (generated on first use), a preset name gives a config
    without weights, anything else must be a local HF directory with a ``config.json``.
    ``tokenizer`` (``--tokenizer``) replaces the model's own tokenizer, if any;
    ``generation_config`` says where default sampling fields come from and
    ``override_generation_config`` sets some of them (``generation_config``);
    ``hf_overrides`` changes the model's config before anything is derived from it.
    """
    spec = _resolve(model, max_model_len, hf_overrides)
    defaults = generation_defaults(generation_config, spec.path, override_generation_config)
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
    derives its default; a request past it is refused. -1 (vLLM's "auto") is the default
    here; the engine then lowers it to what the KV cache holds (``AUTO_MAX_MODEL_LEN``)."""
    if limit < 1:
        raise ValueError(f"the model's max_position_embeddings must be at least 1, got "
                         f"{max_position_embeddings} (from its config.json or hf_overrides).")
    if requested is None or requested == AUTO_MAX_MODEL_LEN:
        return limit
    if requested < 1:
        raise ValueError(f"max_model_len must be at least 1, or -1 (auto: what the KV cache "
                         f"holds, at most the model's context), got {requested}.")
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
