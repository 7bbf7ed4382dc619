"""Lazy access to ``cuda.bindings`` (runtime and driver) so that a CPU-only install imports
cadence, and creation of CUDA objects on the device they name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

_INSTALL_HINT = "The CUDA backend needs cuda-python (pip install cuda-python; it comes with cadence on Linux)."


def cudart() -> ModuleType:
    """Return the ``cuda.bindings.runtime`` module (imported on first use)."""
    try:
        from cuda.bindings import runtime
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(_INSTALL_HINT) from exc
    return runtime


def cudriver() -> ModuleType:
    """Return the ``cuda.bindings.driver`` module (imported on first use)."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(_INSTALL_HINT) from exc
    return driver


@contextmanager
def on_device(index: int) -> Iterator[None]:
    """Make device ``index`` current for the block, then restore the caller's device.

    Streams, events and allocations belong to the device current when they are made; this is
    how ``Stream(device_index=1)`` lands on device 1 whatever the thread had selected.
    """
    from cadence.runtime.errors import check

    rt = cudart()
    previous = int(check(rt.cudaGetDevice(), "cudaGetDevice"))
    if previous == index:
        yield
        return
    # NOTE: a thread with no current context reports device 0; setting 0 back would create a
    # context there (cudaSetDevice initializes it), so such a thread keeps ``index`` current.
    had_context = _has_current_context()
    check(rt.cudaSetDevice(index), "cudaSetDevice")
    try:
        yield
    finally:
        if had_context:
            check(rt.cudaSetDevice(previous), "cudaSetDevice")


def _has_current_context() -> bool:
    from cuda.bindings import driver

    err, ctx = driver.cuCtxGetCurrent()
    return int(err) == 0 and int(ctx) != 0
