"""vLLM's ``hf_overrides``: fields set on a model's config as loaded (a mapping, from the CLI as
JSON), or a function of the config (from Python), applied before the engine derives anything
from the config."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cadence.user_errors import first_line

if TYPE_CHECKING:
    from transformers import PretrainedConfig

HfOverrides = dict[str, Any] | Callable[["PretrainedConfig"], "PretrainedConfig"]


def check_hf_overrides(overrides: object, engine_process: bool) -> None:
    """Refuse, before any engine starts, what cannot be an ``hf_overrides``."""
    if overrides is None:
        return
    if isinstance(overrides, dict):
        names = [k for k in overrides if not isinstance(k, str)]
        if names:
            raise ValueError(f"hf_overrides: field names must be strings, got {names[0]!r}.")
        # NOTE: the config travels to an engine process and TP workers as JSON-like data.
        try:
            json.dumps(overrides, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"hf_overrides must hold JSON values (numbers, strings, "
                             f"booleans, null, lists and objects): {exc}.") from None
        return
    if not callable(overrides):
        raise ValueError("hf_overrides must be a dict of config fields or a function of "
                         f"the config, got {type(overrides).__name__}.")
    if engine_process:
        try:
            pickle.dumps(overrides)
        except Exception as exc:  # noqa: BLE001 - pickling raises many kinds
            raise ValueError(
                "hf_overrides: a function must be picklable (a module-level function) to "
                f"reach the engine process: {exc}.") from None


def apply_hf_overrides(config: PretrainedConfig, overrides: HfOverrides | None
                       ) -> PretrainedConfig:
    """``config`` with vLLM's ``hf_overrides`` applied: a mapping sets each field (a nested
    config, such as a multimodal model's ``text_config``, is updated field by field; any other
    value, a dict included, replaces the field), a function returns the new config."""
    from transformers import PretrainedConfig

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
    if not isinstance(params, dict):
        return overrides
    key = _full_attention_key(params)
    current = dict(params[key]) if key is not None else dict(params)
    given = overrides.get("rope_parameters")
    flat_without_base = (isinstance(given, dict) and bool(given) and "rope_theta" not in given
                         and not any(isinstance(v, dict) for v in given.values()))
    if flat_without_base and current.get("rope_theta") is not None:
        # A flat rope_parameters without its base: the checkpoint's base stays (transformers
        # would fail on the missing key; the engine would silently rotate by 10,000).
        base = current["rope_theta"]
        overrides = {**overrides, "rope_parameters": {**given, "rope_theta": base}}
    if not {"rope_scaling", "rope_theta"} & overrides.keys():
        return overrides
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


def _full_attention_key(params: dict[str, Any]) -> str | None:
    """Where per-layer-type RoPE parameters (every value a dict) keep the full-attention
    layers' (``full_attention``, else the first type); None for flat parameters."""
    if not params or not all(isinstance(v, dict) for v in params.values()):
        return None
    return "full_attention" if "full_attention" in params else next(iter(params))


def _update(target: PretrainedConfig, overrides: dict[str, Any], where: str) -> None:
    from transformers import PretrainedConfig

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
