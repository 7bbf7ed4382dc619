"""vLLM's ``collective_rpc`` on one worker: a model runner's method by name, or a function
called with the runner first (``apply_model``: with the runner's model).

NOTE: the model runs inside CUDA graphs captured over its weights' memory: a function that
changes weights must write into the tensors in place (``param.data.copy_(...)``); a new tensor
put in a weight's place is never read by a captured step.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ApplyModel", "check_timeout", "decode_call", "decode_result", "encode_call",
           "encode_result", "run_on_worker"]


@dataclass(frozen=True)
class ApplyModel:
    """``func(model)`` on a worker (a callable object: it pickles where ``func`` does)."""

    func: Callable[[Any], Any]

    def __post_init__(self) -> None:
        if not callable(self.func):
            raise ValueError(f"apply_model: func must be callable (it gets the model), got "
                             f"{type(self.func).__name__}.")

    def __call__(self, worker: Any) -> Any:
        return self.func(worker.get_model())


def run_on_worker(worker: Any, method: str | Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    """Run ``method`` on ``worker`` between two steps, the device idle before and after (a
    deliberate sync: whatever it reads or writes is not in flight in a step)."""
    if isinstance(method, str):
        fn = getattr(worker, method, None)
        if method.startswith("_") or not callable(fn):
            raise ValueError(f"collective_rpc: the worker has no method {method!r}.")
        call = lambda: fn(*args, **kwargs)  # noqa: E731
    elif callable(method):
        call = lambda: method(worker, *args, **kwargs)  # noqa: E731
    else:
        raise ValueError(f"collective_rpc: method must be a method name or a callable, got "
                         f"{type(method).__name__}.")
    _sync(worker)
    try:
        return call()
    except SystemExit as exc:  # the engine (or this rank) must not exit with the function
        raise RuntimeError(f"collective_rpc: the function raised SystemExit({exc.code!r}).") \
            from None
    finally:
        _sync(worker)


def check_timeout(timeout: Any) -> None:
    """vLLM's ``timeout`` of a collective_rpc: seconds (a positive number) or None."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0 or timeout == float("inf")):
        raise ValueError(f"timeout must be a positive number of seconds or None, got "
                         f"{timeout!r}.")


def encode_call(method: str | Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> bytes:
    """A call that crosses a process boundary (tensor-parallel ranks, an engine process),
    pickled apart from the message that carries it."""
    return _dumps((method, args, kwargs), "the method and its arguments")


def decode_call(payload: bytes) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    try:
        method, args, kwargs = pickle.loads(payload)
    except Exception as exc:  # e.g. a function of the caller's __main__
        raise ValueError(f"collective_rpc: the call cannot be rebuilt where the model runs "
                         f"(define the function in an importable module): {exc}") from None
    return method, args, kwargs


def encode_result(result: Any) -> bytes:
    return _dumps(result, "the results")


def decode_result(data: bytes) -> Any:
    try:
        return pickle.loads(data)
    except Exception as exc:  # e.g. an object of a class only the other side imports
        raise ValueError(f"collective_rpc: the results cannot be rebuilt here: {exc!r}") \
            from None


def _dumps(what: Any, name: str) -> bytes:
    try:
        return pickle.dumps(what)
    except Exception as exc:  # pickle raises several kinds for what it cannot take
        raise ValueError(f"collective_rpc: across processes {name} must be picklable (a "
                         f"module-level function, not a lambda or closure): {exc}") from None


def _sync(worker: Any) -> None:
    device = getattr(worker, "device", None)
    if getattr(device, "type", None) == "cuda":
        import torch

        torch.cuda.synchronize(device)
