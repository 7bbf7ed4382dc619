"""vLLM's ``compilation_config`` (an optimization level, or a mapping): what of it cadence
applies. cadence compiles nothing with torch.compile, so levels and compiler options change
nothing; the CUDA-graph options map onto cadence's own: ``cudagraph_mode`` NONE is
``enforce_eager``, FULL_DECODE_ONLY captures decode graphs only (``max_capture_tokens=0``), the
other modes keep cadence's full graphs of mixed steps; ``max_cudagraph_capture_size`` and the
largest of ``cudagraph_capture_sizes`` cap the captured step sizes (``max_capture_tokens``;
cadence picks its own buckets below the cap), and an empty list captures nothing. A field
vLLM's CompilationConfig does not have is refused, as vLLM refuses it."""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
COMPILATION_MODES = ("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE")
_GRAPH_KEYS = ("cudagraph_mode", "max_cudagraph_capture_size", "cudagraph_capture_sizes")
# vLLM's CompilationConfig fields (it forbids any other), with those of earlier releases that
# configurations still carry (use_inductor, use_cudagraph, full_cuda_graph).
VLLM_FIELDS = frozenset({
    *_GRAPH_KEYS, "level", "mode", "debug_dump_path", "cache_dir", "compile_cache_save_format",
    "backend", "custom_ops", "splitting_ops", "compile_mm_encoder", "compile_sizes",
    "compile_ranges_split_points", "inductor_compile_config", "inductor_passes",
    "cudagraph_num_of_warmups", "cudagraph_copy_inputs", "cudagraph_specialize_lora",
    "use_inductor_graph_partition", "pass_config", "dynamic_shapes_config", "use_inductor",
    "use_cudagraph", "full_cuda_graph",
})


@dataclass(frozen=True)
class GraphChoice:
    """What a ``compilation_config`` asks of the engine's graphs (None: nothing)."""

    enforce_eager: bool | None = None
    max_capture_tokens: int | None = None


def read_compilation_config(value: Any) -> GraphChoice:
    """``value`` checked and read; ValueError naming the field for anything else."""
    if value is None:
        return GraphChoice()
    if _is_int(value):
        _mode(value, "compilation_config")
        return GraphChoice()
    if not isinstance(value, dict):
        raise ValueError("compilation_config must be an optimization level (0-3) or a dict of "
                         f"vLLM's CompilationConfig fields, got {type(value).__name__}.")
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise ValueError(f"compilation_config: field names are strings, got {bad[0]!r}.")
    unknown = sorted(k for k in value if k not in VLLM_FIELDS)
    if unknown:  # a typo would otherwise pass unnoticed (vLLM refuses it too)
        near = difflib.get_close_matches(unknown[0], sorted(VLLM_FIELDS), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(f"compilation_config: unknown field {unknown[0]!r}{hint}; vLLM's "
                         "CompilationConfig has no such field.")
    for key in ("mode", "level"):
        if value.get(key) is not None:
            _mode(value[key], f"compilation_config.{key}")
    eager, cap = None, None
    mode = value.get("cudagraph_mode")
    if mode is not None:
        name = mode.upper() if isinstance(mode, str) else None
        if name not in CUDAGRAPH_MODES:
            raise ValueError(f"compilation_config.cudagraph_mode must be one of "
                             f"{', '.join(CUDAGRAPH_MODES)}, got {mode!r}.")
        eager = name == "NONE" or None
        cap = 0 if name == "FULL_DECODE_ONLY" else None
    size = value.get("max_cudagraph_capture_size")
    if size is not None and (not _is_int(size) or size < 0):
        raise ValueError("compilation_config.max_cudagraph_capture_size must be an integer "
                         f">= 0, got {size!r}.")
    sizes = value.get("cudagraph_capture_sizes")
    if sizes is not None:
        if not isinstance(sizes, list) or not all(_is_int(s) and s > 0 for s in sizes):
            raise ValueError("compilation_config.cudagraph_capture_sizes must be a list of "
                             f"positive integers, got {sizes!r}.")
        if not sizes:  # no size to capture: no graphs at all, as in vLLM
            eager = True
        largest = max(sizes, default=0)
        if size is not None and size != largest:
            raise ValueError(
                f"compilation_config: max_cudagraph_capture_size ({size}) must be the largest "
                f"of cudagraph_capture_sizes ({largest}).")
        size = largest
    if cap is None and size is not None:
        cap = size
    ignored = sorted(k for k in value if k not in (*_GRAPH_KEYS, "mode", "level"))
    if ignored:
        logger.info("compilation_config: %s change nothing here (cadence does not use "
                    "torch.compile).", ", ".join(ignored))
    return GraphChoice(eager, cap)


def graph_settings(value: Any, enforce_eager: bool, max_capture_tokens: int | None
                   ) -> tuple[bool, int | None]:
    """``enforce_eager`` and ``max_capture_tokens`` (EngineArgs') with ``value`` applied; a
    capture cap that disagrees with ``max_capture_tokens`` given as well is a ValueError."""
    choice = read_compilation_config(value)
    cap = choice.max_capture_tokens
    if cap is not None and max_capture_tokens not in (None, cap):
        raise ValueError(f"max_capture_tokens={max_capture_tokens} and compilation_config's "
                         f"capture size {cap} disagree; give one.")
    return (enforce_eager or bool(choice.enforce_eager),
            cap if cap is not None else max_capture_tokens)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mode(value: Any, where: str) -> None:
    if _is_int(value) and 0 <= value < len(COMPILATION_MODES):
        return
    if isinstance(value, str) and value.upper() in COMPILATION_MODES:
        return
    raise ValueError(f"{where} must be 0-3 or one of {', '.join(COMPILATION_MODES)}, "
                     f"got {value!r}.")
