"""Lazy access to ``cuda.bindings.runtime`` so that a CPU-only install imports cadence."""

from __future__ import annotations

from types import ModuleType


def cudart() -> ModuleType:
    """Return the ``cuda.bindings.runtime`` module (imported on first use)."""
    try:
        from cuda.bindings import runtime
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "The CUDA backend needs cuda-python (pip install cuda-python; it comes with cadence on Linux)."
        ) from exc
    return runtime
