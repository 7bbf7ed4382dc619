"""Default sampling parameters from a checkpoint's ``generation_config.json`` (vLLM's
``--generation-config auto|vllm|DIR``).

``auto`` reads the model directory's file, ``vllm`` ignores it, any other value is a directory
holding one. As in vLLM, only the sampling fields the file sets to something other than
transformers' own defaults count (a file that repeats ``top_k: 50`` sets nothing). They become
the defaults of requests that leave those fields unset: ``LLM.generate`` without sampling
parameters, and server requests without ``temperature`` / ``top_p`` / ``top_k`` / ``min_p`` /
``repetition_penalty``. ``max_new_tokens`` becomes ``max_tokens``: the default of the offline
API, and a cap on every server request (vLLM's rule).

``override_generation_config`` (vLLM's ``--override-generation-config``) is a dict of the same
fields laid over them: merged with the file's under ``auto`` or a directory, the only defaults
under ``vllm``. An override applies even where it equals transformers' default, and ``None``
drops the file's value (vLLM's merge); other keys apply to nothing here and are logged.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cadence.sampling_params import SamplingParams

__all__ = ["APPLIED_FIELDS", "generation_defaults"]

logger = logging.getLogger(__name__)

# transformers' GenerationConfig defaults: a field equal to these sets nothing.
_HF_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "top_k": 50,
                                "repetition_penalty": 1.0, "min_p": None,
                                "max_new_tokens": None}
APPLIED_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                  "max_new_tokens")
# A generation_config.json's fields that say nothing about sampling (or are read elsewhere).
_NOT_SAMPLING = frozenset({"bos_token_id", "eos_token_id", "pad_token_id",
                           "decoder_start_token_id", "transformers_version", "_from_model_config",
                           "use_cache"})


def generation_defaults(source: str, model_dir: str | None,
                        override: dict[str, Any] | None = None) -> dict[str, Any]:
    """The default sampling fields for ``--generation-config source`` (``model_dir``: the model's
    directory, None for shape presets) and ``--override-generation-config override``."""
    if override is not None and not isinstance(override, dict):
        raise ValueError("override_generation_config must be a dict of generation config "
                         f"fields, got {type(override).__name__}.")
    fields, where = _file_fields(source, model_dir)
    if override:
        ignored = sorted(str(k) for k in override if k not in _HF_DEFAULTS)
        if ignored:
            logger.warning("override_generation_config: %s set no sampling default (applied: "
                           "%s).", ", ".join(ignored), ", ".join(APPLIED_FIELDS))
        fields.update(_numbers({k: v for k, v in override.items() if k in _HF_DEFAULTS},
                               "override_generation_config"))
        where = (f"{where} with override_generation_config" if where
                 else "override_generation_config")
    defaults = {k: fields[k] for k in APPLIED_FIELDS if fields.get(k) is not None}
    if "max_new_tokens" in defaults:
        n = defaults.pop("max_new_tokens")
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{where}: max_new_tokens is {n!r}, not a positive integer.")
        defaults["max_tokens"] = n
    try:  # checked at start-up, as every request that leaves these fields unset would be
        SamplingParams(**defaults)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    if defaults:
        logger.info("Default sampling parameters (%s): %s", where, defaults)
    return defaults


def _file_fields(source: str, model_dir: str | None) -> tuple[dict[str, Any], str]:
    """The sampling fields ``source``'s generation_config.json sets to something other than
    transformers' defaults (none for ``vllm``, or where the model has no such file), and the
    file's name for errors ("" without one)."""
    if source == "vllm":
        return {}, ""
    if source == "auto":
        if model_dir is None:
            return {}, ""
        path = Path(model_dir) / "generation_config.json"
        if not path.is_file():
            return {}, ""
    else:
        path = Path(source).expanduser() / "generation_config.json"
        if not path.is_file():
            raise ValueError(
                f"generation_config {source!r}: no generation_config.json there; use 'auto' "
                "(the model's), 'vllm' (none) or a directory holding one."
            )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"generation_config: cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"generation_config: {path} does not hold a JSON object.")
    where = f"generation_config: {path}"
    unused = sorted(str(k) for k in data if k not in _HF_DEFAULTS and k not in _NOT_SAMPLING)
    if unused:
        logger.info("%s: %s not applied (cadence applies %s; the end ids are read apart).",
                    where, ", ".join(unused), ", ".join(APPLIED_FIELDS))
    # Checked with the file named: an override may replace a value later.
    diff = _numbers({k: v for k, v in data.items() if k in _HF_DEFAULTS and v != _HF_DEFAULTS[k]},
                    where)
    if isinstance(n := diff.get("max_new_tokens"), int) and n < 1:
        raise ValueError(f"generation_config: {path} sets max_new_tokens to {n!r}, not a "
                         "positive integer.")
    return diff, where


def _numbers(fields: dict[str, Any], where: str) -> dict[str, Any]:
    """``fields``, each a number or None (ValueError naming ``where`` otherwise)."""
    for k, v in fields.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"{where}: {k} is {v!r}, not a number.")
    return fields
