"""Running engine steps under a fixed load inside the torch profiler.

Loads: ``decode`` (``batch`` requests of ``input_len`` random tokens prefill during the warm-up;
every measured step decodes the whole batch), ``prefill`` (each step prefills one new request of
``input_len`` tokens: the token budget is ``input_len``), and ``mixed`` (the decode batch, plus
one new ``input_len``-token request added before each step, so steps mix decode rows and a
prefill). Each measured step runs inside a host range named ``engine_step``, and the engine's
phase ranges are switched on for the capture whatever ``CADENCE_NVTX`` says.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOADS = ("decode", "prefill", "mixed")


@dataclass(frozen=True)
class Load:
    kind: str
    batch: int
    input_len: int
    steps: int
    warmup_steps: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in LOADS:
            raise ValueError(f"load must be one of {LOADS}, not {self.kind!r}")
        if min(self.batch, self.input_len, self.steps) < 1 or self.warmup_steps < 0:
            raise ValueError("batch, input length and steps must be >= 1, warm-up steps >= 0")

    @property
    def decoders(self) -> int:
        return 0 if self.kind == "prefill" else self.batch

    @property
    def output_len(self) -> int:
        return self.warmup_steps + self.steps + 2

    def context_tokens(self) -> float:
        """Mean tokens of KV context one attention layer reads per measured step."""
        decode = self.decoders * (self.input_len + self.warmup_steps + self.steps / 2)
        return decode + (self.input_len if self.kind != "decode" else 0)


@dataclass
class Window:
    steps: int
    elapsed_s: float
    tokens: int


def make_engine(engine_args: Any, load: Load):
    from cadence.engine.core import EngineCore

    args = engine_args
    # With async scheduling a finished prompt holds its slot one step longer: room for two.
    args.max_num_seqs = load.decoders + 2
    if args.max_model_len is None:
        args.max_model_len = load.input_len + load.output_len + 16
    if load.kind == "prefill":
        args.max_num_batched_tokens = load.input_len
    elif args.max_num_batched_tokens is None:
        # The decode batch prefills in one warm-up step; a mixed step fits batch + a prompt.
        args.max_num_batched_tokens = max(
            8192, load.batch * load.input_len, load.batch + load.input_len)
    args.skip_tokenizer_init = True
    return EngineCore(args)


def _add(core, n: int, length: int, max_tokens: int, seed: int, tag: str) -> list[str]:
    from cadence.bench.common import random_prompts
    from cadence.core_types import EngineCoreRequest
    from cadence.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(n)]
    for rid, prompt in zip(ids, random_prompts(n, length, core.vocab_size, seed)):
        core.add_request(EngineCoreRequest(rid, prompt, params))
    return ids


@contextlib.contextmanager
def engine_ranges() -> Iterator[None]:
    """The engine's phase ranges on, whatever ``CADENCE_NVTX`` said at import."""
    import cadence.engine.core as core_mod
    import cadence.worker.model_runner as runner_mod
    from cadence.profiling import make_nvtx_range

    # Hazard: the modules bound ``nvtx_range`` at import; rebinding reaches their call sites,
    # and the originals are restored even when the capture fails.
    saved = core_mod.nvtx_range, runner_mod.nvtx_range
    ranges = make_nvtx_range(True)
    core_mod.nvtx_range = runner_mod.nvtx_range = ranges
    try:
        yield
    finally:
        core_mod.nvtx_range, runner_mod.nvtx_range = saved


def run_steps(core, load: Load, n: int, mark, tag: str) -> Window:
    """Up to ``n`` steps, each inside ``mark("engine_step")``; a mixed load adds its prefill
    request before each step, a prefill load has one queued per step."""
    step = core.step_fn
    tokens = steps = 0
    start = time.perf_counter()
    for i in range(n):
        if load.kind == "mixed":
            _add(core, 1, load.input_len, 1, load.seed + 1000 + i, f"{tag}-p{i}")
        if not core.has_work():
            break
        with mark("engine_step"):
            outs, _ = step()
        steps += 1
        tokens += sum(len(o.new_token_ids) for o in outs.outputs) if outs is not None else 0
    return Window(steps, time.perf_counter() - start, tokens)


def _profile(core, load: Load, out: Path, cuda: bool) -> Window:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from cadence.profiling import make_nvtx_range

    mark = make_nvtx_range(True, user_annotation=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with engine_ranges(), profile(activities=activities, record_shapes=True) as prof:
        window = run_steps(core, load, load.steps, mark, "m")
        if cuda:
            torch.cuda.synchronize()  # the last launched step's kernels belong in the trace
    out.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out))
    return window


def _cuda_api(core, load: Load) -> Window:
    """The measured steps between cudaProfilerStart and Stop (for ``nsys profile
    --capture-range=cudaProfilerApi``), marked with NVTX ranges."""
    import torch

    from cadence.profiling import make_nvtx_range

    if core.config.device != "cuda":
        raise ValueError("--profiler cuda-api and nsys need --device cuda")
    with engine_ranges():
        torch.cuda.profiler.start()
        try:
            window = run_steps(core, load, load.steps, make_nvtx_range(True), "m")
            torch.cuda.synchronize()
        finally:
            torch.cuda.profiler.stop()
    return window


def trace_load(engine_args: Any, load: Load, out: Path | None,
               profiler: str = "torch") -> dict[str, Any]:
    """Warm up, run ``load.steps`` measured steps, drain; returns the run's description (the
    model's shape included, for the byte floors). ``torch``: the steps are traced into ``out``
    (a Chrome trace); ``cuda-api``: they are bracketed for Nsight Systems."""
    from cadence.bench.common import device_name
    from cadence.profiling import make_nvtx_range
    from cadence.trace.floors import ModelShape

    core = make_engine(engine_args, load)
    cuda = core.config.device == "cuda"
    try:
        if load.kind == "prefill":
            _add(core, load.warmup_steps + load.steps, load.input_len, 1, load.seed, "p")
        else:
            _add(core, load.batch, load.input_len, load.output_len, load.seed, "d")
        run_steps(core, load, load.warmup_steps, make_nvtx_range(False), "w")
        if profiler == "torch":
            assert out is not None
            window = _profile(core, load, out, cuda)
        else:
            window = _cuda_api(core, load)
        core.abort_requests(list(core.scheduler.requests))
        while core.has_work():
            core.step_fn()
        kv_dtype = getattr(core.runner, "kv_dtype", core.dtype)  # an FP8 cache: 1 byte
        shape = ModelShape.from_model(core.runner.model, core.dtype.itemsize, kv_dtype.itemsize)
        info = {
            "device": core.config.device,
            "device_name": device_name(),
            "dtype": str(core.dtype),
            "async_scheduling": core.batch_queue_size > 1,
            "enforce_eager": core.config.enforce_eager,
        }
    finally:
        core.shutdown()
    return {
        **info,
        "load": {"kind": load.kind, "batch": load.batch, "input_len": load.input_len,
                 "steps": load.steps, "warmup_steps": load.warmup_steps},
        "context_tokens": load.context_tokens(),
        "model_shape": shape.to_json(),
        "host_ms_per_step": window.elapsed_s / max(window.steps, 1) * 1e3,
        "tokens": window.tokens,
        "profiler": profiler,
        "trace": str(out) if profiler == "torch" else None,
    }
