from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from cadence import profiling
from cadence.profiling import make_nvtx_range


def _trace(fn, tmp_path: Path) -> list[dict]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]


def _named(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e.get("name") == name]


def test_off_is_one_shared_no_op(tmp_path) -> None:
    off = make_nvtx_range(False)
    assert off("schedule") is off("update")

    def f(x: int) -> int:
        return x + 1

    assert off("sample")(f) is f

    def body() -> None:
        with off("schedule"):
            torch.ones(2).add_(1)

    events = _trace(body, tmp_path)
    assert _named(events, "schedule") == []
    assert _named(events, "aten::add_")  # the profiler did record the work itself


def test_on_records_nested_ranges_and_decorated_calls(tmp_path) -> None:
    on = make_nvtx_range(True, nvtx=False)

    @on("sample")
    def sample(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def body() -> None:
        with on("prepare"):
            with on("copy"):
                torch.ones(4).add_(1)
            assert sample(torch.ones(2)).sum().item() == 4
        with pytest.raises(RuntimeError), on("update"):
            raise RuntimeError("boom")
        with on("schedule"):
            pass

    events = _trace(body, tmp_path)
    (prepare,) = _named(events, "prepare")
    (copy,) = _named(events, "copy")
    (sample_ev,) = _named(events, "sample")
    for inner in (copy, sample_ev):
        assert prepare["ts"] <= inner["ts"]
        assert inner["ts"] + inner["dur"] <= prepare["ts"] + prepare["dur"]
    # A range left by an exception is closed, and later ranges are recorded normally.
    assert len(_named(events, "update")) == 1
    assert len(_named(events, "schedule")) == 1


def test_user_annotation_ranges(tmp_path) -> None:
    mark = make_nvtx_range(True, nvtx=False, user_annotation=True)

    def body() -> None:
        with mark("engine_step"):
            torch.ones(2).add_(1)

    (step,) = _named(_trace(body, tmp_path), "engine_step")
    assert step["cat"] == "user_annotation"


def _fresh_module(monkeypatch, value: str | None):
    """A private copy of cadence.profiling imported under the given CADENCE_NVTX."""
    if value is None:
        monkeypatch.delenv("CADENCE_NVTX", raising=False)
    else:
        monkeypatch.setenv("CADENCE_NVTX", value)
    spec = importlib.util.spec_from_file_location("profiling_copy", profiling.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_environment_switch(monkeypatch, tmp_path) -> None:
    assert not _fresh_module(monkeypatch, None).NVTX_ENABLED
    assert not _fresh_module(monkeypatch, "0").NVTX_ENABLED
    on = _fresh_module(monkeypatch, "1")
    assert on.NVTX_ENABLED

    def body() -> None:
        with on.nvtx_range("forward"):
            torch.ones(2).add_(1)

    assert len(_named(_trace(body, tmp_path), "forward")) == 1


@pytest.mark.parametrize("user_annotation", [False, True])
def test_a_decorated_function_calling_itself_nests_its_ranges(tmp_path,
                                                              user_annotation: bool) -> None:
    """Each call of a decorated function is a range of its own: a recursive call's range lies
    inside its caller's, which stays open until the caller returns."""
    on = make_nvtx_range(True, nvtx=False, user_annotation=user_annotation)

    @on("prepare")
    def depth(n: int) -> int:
        torch.ones(2).add_(1)
        inner = depth(n - 1) if n else 0
        torch.ones(2).add_(1)  # after the inner call returned: still in this call's range
        return inner + 1

    def body() -> None:
        assert depth(1) == 2

    events = sorted(_named(_trace(body, tmp_path), "prepare"), key=lambda e: e["ts"])
    assert len(events) == 2
    outer, inner = events
    assert outer["ts"] <= inner["ts"]
    assert inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
    assert inner["dur"] < outer["dur"]


def test_nvtx_push_and_pop_pair_around_each_range(monkeypatch) -> None:
    """``nvtx=True`` pushes a range of the name on entry and pops it on exit (also when the
    block raises); ``nvtx=False`` touches NVTX never, whatever torch has."""
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append(("pop",)))
    on = make_nvtx_range(True, nvtx=True)

    @on("sample")
    def sample() -> None:
        calls.append(("body",))

    with on("forward"):
        sample()
    with pytest.raises(RuntimeError), on("update"):
        raise RuntimeError("boom")
    assert calls == [("push", "forward"), ("push", "sample"), ("body",), ("pop",), ("pop",),
                     ("push", "update"), ("pop",)]
    calls.clear()
    monkeypatch.setattr(profiling, "_nvtx_available", lambda: True)
    with make_nvtx_range(True, nvtx=False)("copy"):
        pass
    assert calls == []
    with make_nvtx_range(True)("copy"):  # default: NVTX where torch has it
        pass
    assert calls == [("push", "copy"), ("pop",)]
