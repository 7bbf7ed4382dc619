"""Named ranges around engine phases for Nsight Systems (NVTX) and torch-profiler traces.

``nvtx_range(name)`` is chosen once, when this module is imported, from ``CADENCE_NVTX``:

- off (the default): it returns one shared do-nothing object; ``with nvtx_range("x"):`` costs a
  function call and an empty ``__enter__``/``__exit__``, and ``@nvtx_range("x")`` returns the
  function unchanged.
- on: each range is a torch record-function range (so it shows in torch-profiler traces as a
  host event of that name) and, on CUDA builds of torch, an NVTX push/pop (so Nsight Systems
  shows it on the host thread's timeline).

The environment is read at import, so ``CADENCE_NVTX=1`` must be set before ``cadence`` is
imported. ``make_nvtx_range(enabled)`` builds either form explicitly (tools, tests).

Range names used by the engine: ``schedule``, ``prepare``, ``forward`` (eager) or ``replay``
(CUDA graph), ``sample``, ``copy``, ``update``; trace tools mark whole steps ``engine_step``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch

from cadence.envs import read_envs

F = TypeVar("F", bound=Callable[..., Any])

PHASES: tuple[str, ...] = ("schedule", "prepare", "forward", "replay", "sample", "copy", "update")
STEP_RANGE = "engine_step"


class Range(Protocol):
    def __enter__(self) -> None: ...

    def __exit__(self, *exc: object) -> None: ...

    def __call__(self, fn: F) -> F: ...


class _NullRange:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        return None

    def __call__(self, fn: F) -> F:
        return fn


_NULL_RANGE = _NullRange()


def _nvtx_available() -> bool:
    # CPU builds of torch replace the NVTX bindings with a stub that raises on every call.
    return getattr(torch._C, "_nvtx", None) is not None


# The C++ record-function context (well under a microsecond per range) where this torch has it;
# it shows as a ``cpu_op``. The public ``record_function`` goes through the op dispatcher (several
# microseconds per range) and shows as a ``user_annotation``, mirrored on the GPU timeline.
_FAST_RECORD: Any = getattr(torch._C._profiler, "_RecordFunctionFast", None)


class _ActiveRange:
    """One entry of a named range; a fresh object per ``nvtx_range`` call, so nesting and
    threads never share state."""

    __slots__ = ("name", "nvtx", "recorder", "_record")

    def __init__(self, name: str, nvtx: bool, recorder: Callable[[str], Any]) -> None:
        self.name = name
        self.nvtx = nvtx
        self.recorder = recorder
        self._record: Any = None

    def __enter__(self) -> None:
        if self.nvtx:
            torch.cuda.nvtx.range_push(self.name)
        self._record = self.recorder(self.name)
        self._record.__enter__()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        record, self._record = self._record, None
        if record is not None:
            record.__exit__(None, None, None)
        if self.nvtx:
            torch.cuda.nvtx.range_pop()

    def __call__(self, fn: F) -> F:
        name, nvtx, recorder = self.name, self.nvtx, self.recorder

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _ActiveRange(name, nvtx, recorder):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def _null_range(name: str) -> Range:
    return _NULL_RANGE


def make_nvtx_range(
    enabled: bool, nvtx: bool | None = None, user_annotation: bool = False
) -> Callable[[str], Range]:
    """The range factory for ``enabled``. ``nvtx`` (default: whether torch has NVTX) adds the
    NVTX push/pop; ``user_annotation`` records through the public ``record_function`` (slower,
    but the range is also drawn on the GPU timeline of torch-profiler traces)."""
    if not enabled:
        return _null_range
    use_nvtx = _nvtx_available() if nvtx is None else nvtx
    recorder = (
        torch.profiler.record_function if user_annotation or _FAST_RECORD is None else _FAST_RECORD
    )

    def active_range(name: str) -> Range:
        return _ActiveRange(name, use_nvtx, recorder)

    return active_range


nvtx_range: Callable[[str], Range] = make_nvtx_range(read_envs().nvtx)
NVTX_ENABLED: bool = nvtx_range is not _null_range
