"""CUDA runtime and driver errors: every failing call raises ``CudaError`` naming the call and the
error."""

from __future__ import annotations

from typing import Any


class NoCudaDeviceError(RuntimeError):
    """The CUDA backend was asked for on a machine without a CUDA device."""


class CudaError(RuntimeError):
    """A CUDA runtime call returned an error code."""

    def __init__(self, call: str, code: int, name: str, description: str = "") -> None:
        self.call = call
        self.code = code
        self.name = name
        self.description = description
        detail = f": {description}" if description else ""
        super().__init__(f"{call} failed with {name} ({code}){detail}")

    def __reduce__(self):  # pickled across processes (tensor-parallel ranks)
        return type(self), (self.call, self.code, self.name, self.description)


def _describe(err: Any) -> tuple[int, str, str]:
    code = int(err)
    name = getattr(err, "name", None) or f"cudaError({code})"
    description = ""
    try:
        from cuda.bindings import runtime

        status, text = runtime.cudaGetErrorString(err)
        if int(status) == 0 and text:
            description = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # the description is a courtesy; never mask the original error
        pass
    return code, name, description


def _clear_last_error() -> None:
    # cudart keeps a failed call's code as the thread's "last error" until it is read; torch's
    # launch checks read it, so a stale code would surface there. Sticky errors stay regardless.
    try:
        from cuda.bindings import runtime

        runtime.cudaGetLastError()
    except Exception:
        pass


def raise_for(err: Any, call: str) -> None:
    """Raise ``CudaError`` for a non-success error code (clearing cudart's last-error state)."""
    code, name, description = _describe(err)
    _clear_last_error()
    raise CudaError(call, code, name, description)


def check(result: tuple[Any, ...], call: str) -> Any:
    """Unpack a ``cuda.bindings`` result tuple ``(err, *values)``.

    Raises ``CudaError`` when ``err`` is not ``cudaSuccess``; otherwise returns ``None`` for no
    values, the value itself for one, and the tuple of values for several.
    """
    err = result[0]
    if err:
        raise_for(err, call)
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


def raise_for_driver(err: Any, call: str) -> None:
    """Raise ``CudaError`` for a non-success ``CUresult`` of a driver API call."""
    code = int(err)
    name = getattr(err, "name", None) or f"CUresult({code})"
    description = ""
    try:
        from cuda.bindings import driver

        status, text = driver.cuGetErrorString(err)
        if int(status) == 0 and text:
            description = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # the description is a courtesy; never mask the original error
        pass
    raise CudaError(call, code, name, description)


def check_driver(result: tuple[Any, ...], call: str) -> Any:
    """``check`` for driver API results (``CUresult`` first)."""
    err = result[0]
    if err:
        raise_for_driver(err, call)
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]
