"""vLLM's collective_rpc on one worker (``cadence/worker/worker_rpc.py``), with a stand-in
worker: names, callables, the model, and what cannot cross a process boundary."""

from __future__ import annotations

import pickle

import pytest

from cadence.worker.worker_rpc import (
    ApplyModel,
    decode_call,
    encode_call,
    encode_result,
    run_on_worker,
)


class Worker:
    device = None

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def get_model(self) -> str:
        return "the model"

    def scale(self, x: int, *, by: int = 2) -> int:
        self.calls.append((x, by))
        return x * by

    def _private(self) -> None:
        raise AssertionError("never called")


def double_of(worker: Worker, x: int) -> int:
    return worker.scale(x)


def test_a_method_by_name_and_a_function_take_the_arguments() -> None:
    w = Worker()
    assert run_on_worker(w, "scale", (3,), {"by": 5}) == 15
    assert run_on_worker(w, double_of, (4,), {}) == 8
    assert run_on_worker(w, lambda worker: worker.get_model(), (), {}) == "the model"
    assert run_on_worker(w, ApplyModel(len), (), {}) == len("the model")
    with pytest.raises(ValueError, match="apply_model: func must be callable"):
        ApplyModel(5)  # type: ignore[arg-type]
    assert w.calls == [(3, 5), (4, 2)]


@pytest.mark.parametrize(("method", "match"), [
    ("nope", "no method 'nope'"), ("_private", "no method '_private'"),
    ("calls", "no method 'calls'"), (7, "a method name or a callable"),
])
def test_what_is_not_a_workers_method_is_refused(method, match) -> None:
    with pytest.raises(ValueError, match=match):
        run_on_worker(Worker(), method, (), {})


def test_a_call_crosses_processes_pickled_and_what_cannot_is_named() -> None:
    method, args, kwargs = decode_call(encode_call(double_of, (4,), {"k": 1}))
    assert method is double_of and args == (4,) and kwargs == {"k": 1}
    assert pickle.loads(encode_result([1, "a"])) == [1, "a"]
    with pytest.raises(ValueError, match="the method and its arguments must be picklable"):
        encode_call(lambda w: w, (), {})
    with pytest.raises(ValueError, match="the results must be picklable"):
        encode_result([lambda: 0])
    # A function the other side cannot import (here: its module's attribute is gone there).
    payload = pickle.dumps((double_of, (), {})).replace(b"double_of", b"double_gone")
    with pytest.raises(ValueError, match="cannot be rebuilt where the model runs"):
        decode_call(payload)
