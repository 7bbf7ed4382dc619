"""vLLM's start_profile / stop_profile: the torch profiler around what the engine runs between
the two calls, a gzipped Chrome trace per window in CADENCE_TORCH_PROFILER_DIR."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from cadence import LLM, SamplingParams
from cadence.engine import AsyncLLM
from cadence.torch_profiler import TorchProfiler
from tests.tiny import tiny_args

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def _events(path: str) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def test_the_window_states_and_the_file(tmp_path: Path) -> None:
    import torch

    off = TorchProfiler("", cuda=False)
    with pytest.raises(RuntimeError, match="CADENCE_TORCH_PROFILER_DIR"):
        off.start()
    prof = TorchProfiler(str(tmp_path / "traces"), cuda=False)
    assert prof.stop() is None  # nothing running: a no-op (vLLM's)
    prof.start("run 1/a")
    prof.start()  # running already: a no-op too
    with pytest.raises(ValueError, match="profile_prefix must be a string"):
        TorchProfiler(str(tmp_path), cuda=False).start(7)
    torch.ones(64, 64) @ torch.ones(64, 64)
    path = Path(prof.stop())
    # The prefix's unsafe characters are replaced, then "_"; the directory is made for it.
    assert path.parent == tmp_path / "traces" and path.name.startswith("run_1_a_")
    assert path.name.endswith(".pt.trace.json.gz")
    assert any(e.get("name") == "aten::mm" for e in _events(str(path)))
    prof.start("..hidden")
    second = Path(prof.stop())
    assert second != path and second.exists() and second.name.startswith("hidden_")
    # Two profilers of one process (two engines): the second cannot start while the first
    # runs (torch has one), and traces of the same second never share a name.
    other = TorchProfiler(str(tmp_path / "traces"), cuda=False, rank=1)
    prof.start()
    with pytest.raises(RuntimeError, match="Another torch profiler"):
        other.start()
    first = prof.stop()
    other.start()
    by_rank = other.stop()
    assert "_rank1." in by_rank and by_rank != first
    with torch.profiler.profile():  # the caller's own profiler is left alone
        with pytest.raises(RuntimeError, match="Another torch profiler"):
            prof.start()
    # A window open at shutdown is stopped and written (vLLM's).
    prof.start("closing")
    prof.close()
    assert not prof.running
    assert len([p for p in (tmp_path / "traces").iterdir() if p.name.startswith("closing_")]) == 1
    assert len(list((tmp_path / "traces").iterdir())) == 5


def test_an_unusable_directory_is_refused_at_the_start(tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    prof = TorchProfiler(str(taken), cuda=False)
    with pytest.raises(RuntimeError, match="cannot be made"):
        prof.start()
    assert not prof.running


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
        assert llm.stop_profile() is None  # nothing running
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
        await engine.start_profile()  # running already: a no-op
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


def test_tensor_parallel_ranks_write_their_own_traces(tmp_path: Path, monkeypatch) -> None:
    """With tensor parallelism the model runs in the ranks' processes: each profiles itself
    and writes its trace (rank 0's path returned), every one holding the model's ops. The
    ranks run on the CPU (two of them on any machine, one GPU or none)."""
    monkeypatch.setenv("CADENCE_TORCH_PROFILER_DIR", str(tmp_path))
    llm = LLM("tiny", async_scheduling=False, tensor_parallel_size=2, device="cpu")
    try:
        llm.start_profile("tp")
        llm.generate(["Hello world"] * 2, PARAMS, use_tqdm=False)
        path = llm.stop_profile()
    finally:
        llm.shutdown()
    traces = sorted(tmp_path.iterdir())
    assert len(traces) == 2 and Path(path).name.startswith("tp_") and "_rank0." in path
    assert "_rank1." in traces[1].name or "_rank1." in traces[0].name
    for trace in traces:
        assert any(e.get("name", "").startswith("aten::") for e in _events(str(trace)))


def test_vllms_recording_switches(tmp_path: Path, monkeypatch) -> None:
    """VLLM_TORCH_PROFILER_RECORD_SHAPES / _WITH_STACK / _WITH_FLOPS / _WITH_PROFILE_MEMORY
    (or CADENCE_ ones, which win) pass to torch's profiler; shapes are recorded by default."""
    import torch

    from cadence.envs import read_envs

    for name in ("RECORD_SHAPES", "WITH_STACK", "WITH_FLOPS", "WITH_PROFILE_MEMORY"):
        monkeypatch.delenv(f"CADENCE_TORCH_PROFILER_{name}", raising=False)
        monkeypatch.delenv(f"VLLM_TORCH_PROFILER_{name}", raising=False)
    assert read_envs().torch_profiler_options == ()
    monkeypatch.setenv("VLLM_TORCH_PROFILER_RECORD_SHAPES", "1")
    monkeypatch.setenv("CADENCE_TORCH_PROFILER_RECORD_SHAPES", "0")
    monkeypatch.setenv("VLLM_TORCH_PROFILER_WITH_FLOPS", "1")
    options = read_envs().torch_profiler_options
    assert options == (("record_shapes", False), ("with_flops", True))

    def mm_args(prof: TorchProfiler) -> dict:
        prof.start()
        torch.ones(32, 16) @ torch.ones(16, 8)
        (mm,) = [e for e in _events(prof.stop()) if e.get("name") == "aten::mm"]
        return mm.get("args", {})

    assert "Input Dims" in mm_args(TorchProfiler(str(tmp_path), cuda=False))
    no_shapes = TorchProfiler(str(tmp_path), cuda=False, options=options[:1])
    assert "Input Dims" not in mm_args(no_shapes)
    # FLOPs on: torch counts them from the shapes, so it records those again.
    assert "Input Dims" in mm_args(TorchProfiler(str(tmp_path), cuda=False, options=options))
