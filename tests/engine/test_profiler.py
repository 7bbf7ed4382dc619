"""vLLM's start_profile / stop_profile: the torch profiler around what the engine runs between
the two calls, a gzipped Chrome trace per window in CADENCE_TORCH_PROFILER_DIR."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from cadence import LLM, SamplingParams
from cadence.engine import AsyncLLM
from cadence.engine.profiler import TorchProfiler
from tests.tiny import tiny_args

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def _events(path: str) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def test_the_window_states_and_the_file(tmp_path: Path) -> None:
    off = TorchProfiler("", cuda=False)
    with pytest.raises(RuntimeError, match="CADENCE_TORCH_PROFILER_DIR"):
        off.start()
    prof = TorchProfiler(str(tmp_path / "traces"), cuda=False)
    with pytest.raises(RuntimeError, match="not running"):
        prof.stop()
    prof.start("run 1/a")
    with pytest.raises(RuntimeError, match="already running"):
        prof.start()
    import torch

    torch.ones(64, 64) @ torch.ones(64, 64)
    path = Path(prof.stop())
    # The prefix's unsafe characters are replaced; the file is in the directory, made for it.
    assert path.parent == tmp_path / "traces" and path.name.startswith("run_1_a")
    assert path.name.endswith(".pt.trace.json.gz")
    assert any(e.get("name") == "aten::mm" for e in _events(str(path)))
    prof.start()
    second = prof.stop()
    assert second != str(path) and Path(second).exists()
    prof.start()
    prof.close()  # a window left open at shutdown is dropped
    assert not prof.running and len(list((tmp_path / "traces").iterdir())) == 2


def test_llm_profiles_the_generation_between_the_calls(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CADENCE_TORCH_PROFILER_DIR", str(tmp_path))
    llm = LLM("tiny", async_scheduling=False)
    try:
        llm.start_profile()
        llm.generate("Hello", PARAMS, use_tqdm=False)
        path = llm.stop_profile()
        names = {e.get("name", "") for e in _events(path)}
        # The model's forward ran inside the window: its matrix products are in the trace.
        assert any(n.startswith("aten::") for n in names)
        assert {"aten::linear", "aten::mm", "aten::addmm", "aten::matmul"} & names
        with pytest.raises(RuntimeError, match="not running"):
            llm.stop_profile()
    finally:
        llm.shutdown()
    monkeypatch.delenv("CADENCE_TORCH_PROFILER_DIR")
    monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path / "vllm"))  # vLLM's name too
    llm = LLM("tiny", async_scheduling=False)
    try:
        llm.start_profile()
        assert Path(llm.stop_profile()).parent == tmp_path / "vllm"
    finally:
        llm.shutdown()


def test_profiling_is_off_without_the_directory(monkeypatch) -> None:
    monkeypatch.delenv("CADENCE_TORCH_PROFILER_DIR", raising=False)
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    llm = LLM("tiny", async_scheduling=False)
    try:
        with pytest.raises(RuntimeError, match="Profiling is not enabled"):
            llm.start_profile()
        assert llm.generate("Hello", PARAMS, use_tqdm=False)[0].finished
    finally:
        llm.shutdown()


async def test_async_llm_profiles_in_the_core(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CADENCE_TORCH_PROFILER_DIR", str(tmp_path))
    engine = AsyncLLM.from_engine_args(tiny_args())
    try:
        await engine.start_profile("async")
        with pytest.raises(RuntimeError, match="already running"):
            await engine.start_profile()
        outs = [o async for o in engine.generate("Hello", PARAMS, "p")]
        assert outs[-1].finished
        path = await engine.stop_profile()
        assert Path(path).name.startswith("async")
        assert any(e.get("name", "").startswith("aten::") for e in _events(path))
    finally:
        engine.shutdown()


@pytest.mark.gpu
def test_a_gpu_trace_holds_the_steps_kernels(tmp_path: Path, monkeypatch) -> None:
    """On CUDA the window records the device's kernels too, those replayed in CUDA graphs
    among them (decode steps of the tiny model run as graphs)."""
    monkeypatch.setenv("CADENCE_TORCH_PROFILER_DIR", str(tmp_path))
    llm = LLM("tiny", async_scheduling=False, device="cuda")
    try:
        llm.generate("Hello", PARAMS, use_tqdm=False)  # compiled and captured before the window
        llm.start_profile()
        out = llm.generate("Hello", SamplingParams(max_tokens=16, temperature=0.0,
                                                   ignore_eos=True), use_tqdm=False)
        events = _events(llm.stop_profile())
    finally:
        llm.shutdown()
    assert len(out[0].outputs[0].token_ids) == 16
    kernels = [e for e in events if e.get("cat") == "kernel"]
    # At least one kernel per decode step (15 of them after the prompt's step).
    assert len(kernels) >= 15
