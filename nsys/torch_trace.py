"""Run N engine steps under a fixed load with the torch profiler; write a Chrome/Perfetto trace.

``batch_size`` requests of ``input_len`` random tokens are added at once, ``warmup_steps`` steps
run unrecorded (they hold the prefill), then ``steps`` steps run inside the profiler, each in a
host range named ``engine_step``. The trace goes to ``--out`` (open it in Perfetto or
chrome://tracing) and its summary from ``gaps.py`` is printed.

``--profiler cuda-api`` records nothing itself: it brackets the measured steps with
cudaProfilerStart/Stop and marks steps with NVTX, for ``nsys profile --capture-range=
cudaProfilerApi`` (see ``nsys_profile.sh``). ``--profiler none`` only times the steps (the
reference for profiler overhead; with ``CADENCE_NVTX=1`` the steps still get NVTX marks).

Example: ``python nsys/torch_trace.py --model qwen3-0.6b --load-format dummy --batch-size 32
--steps 50 --out trace.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadence.bench.report import made_output_file, output_file  # noqa: E402
from cadence.cli_types import int_at_least  # noqa: E402
from cadence.profiling import make_nvtx_range, nvtx_range  # noqa: E402
from cadence.user_errors import ArgumentParser, one_line_errors  # noqa: E402
from nsys.gaps import format_summary, summarize  # noqa: E402

logger = logging.getLogger("nsys.torch_trace")

PROFILERS = ("torch", "cuda-api", "none")
PROG = "nsys/torch_trace.py"


@dataclass
class Load:
    batch_size: int
    input_len: int
    output_len: int
    steps: int
    warmup_steps: int
    seed: int
    temperature: float = 0.0
    sampling_seed: int | None = None
    grammar: str | None = None  # EBNF of structured outputs, for every request


@dataclass
class Window:
    """What happened inside the measured steps (host clock)."""

    steps: int
    elapsed_s: float
    tokens: int
    step_s: list[float]


def build_parser() -> argparse.ArgumentParser:
    from cadence.engine.engine_args import EngineArgs

    p = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    EngineArgs.add_cli_args(p)
    p.add_argument("--batch-size", type=int_at_least(1), default=1)
    p.add_argument("--input-len", type=int_at_least(1), default=128)
    p.add_argument(
        "--output-len",
        type=int_at_least(1),
        default=None,
        help="tokens per request (default: warmup + steps + 1, so every measured "
        "step is a full decode step)",
    )
    p.add_argument("--steps", type=int_at_least(1), default=20, help="measured engine steps")
    p.add_argument(
        "--warmup-steps",
        type=int_at_least(0),
        default=5,
        help="unrecorded steps first; they include the prefill",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="of every request")
    p.add_argument("--sampling-seed", type=int, default=None, help="per-request seed (seed + i)")
    p.add_argument("--grammar", default=None,
                   help="EBNF grammar every request generates under (structured outputs; needs "
                   "a tokenizer, e.g. --tokenizer tiny)")
    p.add_argument("--profiler", choices=PROFILERS, default="torch")
    p.add_argument("--out", default="trace.json", help="Chrome trace path (.json or .json.gz)")
    p.add_argument("--summary-out", type=output_file, default=None,
                   help="also write the summary JSON here")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def _load(ns: argparse.Namespace) -> Load:
    output_len = ns.output_len or ns.warmup_steps + ns.steps + 1
    if ns.warmup_steps + ns.steps > output_len:
        logger.warning(
            "output_len %d < warmup + steps: the last measured steps are not all full decode steps",
            output_len,
        )
    return Load(ns.batch_size, ns.input_len, output_len, ns.steps, ns.warmup_steps, ns.seed,
                ns.temperature, ns.sampling_seed, ns.grammar)


def make_engine(ns: argparse.Namespace, load: Load):
    from cadence.engine.core import EngineCore
    from cadence.engine.engine_args import EngineArgs

    args = EngineArgs.from_cli_args(ns)
    args.max_num_seqs = max(load.batch_size, 1)
    if args.max_model_len is None:
        args.max_model_len = load.input_len + load.output_len + 16
    # The whole batch prefills in one step, so the measured steps are decode only.
    if args.max_num_batched_tokens is None:
        args.max_num_batched_tokens = max(8192, load.batch_size * load.input_len)
    args.skip_tokenizer_init = True
    return EngineCore(args)


def add_requests(core, load: Load) -> list[str]:
    from cadence.bench.common import random_prompts
    from cadence.core_types import EngineCoreRequest
    from cadence.sampling_params import SamplingParams, StructuredOutputsParams

    grammar = None if load.grammar is None else StructuredOutputsParams(grammar=load.grammar)
    ids = []
    prompts = random_prompts(load.batch_size, load.input_len, core.vocab_size, load.seed)
    for i, prompt in enumerate(prompts):
        seed = None if load.sampling_seed is None else load.sampling_seed + i
        params = SamplingParams(temperature=load.temperature, seed=seed,
                                max_tokens=load.output_len, ignore_eos=True,
                                structured_outputs=grammar)
        ids.append(f"trace-{i}")
        core.add_request(EngineCoreRequest(ids[-1], prompt, params))
    return ids


def _count_tokens(outs: Any) -> int:
    if outs is None:
        return 0
    return sum(len(o.new_token_ids) for o in outs.outputs)


def run_steps(core, n: int, mark) -> Window:
    """Up to ``n`` engine steps, each inside ``mark("engine_step")``."""
    step = core.step_fn
    tokens = 0
    times: list[float] = []
    start = time.perf_counter()
    for _ in range(n):
        if not core.has_work():
            break
        t0 = time.perf_counter()
        with mark("engine_step"):
            outs, _ = step()
        times.append(time.perf_counter() - t0)
        tokens += _count_tokens(outs)
    return Window(len(times), time.perf_counter() - start, tokens, times)


def _measure(core, load: Load, profiler: str, out: Path, cuda: bool) -> Window:
    import torch

    # A user annotation (drawn on the GPU rows of the trace too), plus NVTX on CUDA builds.
    mark = make_nvtx_range(True, user_annotation=True)
    if profiler == "torch":
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities, record_shapes=False, with_stack=False) as prof:
            window = run_steps(core, load.steps, mark)
            if cuda:
                torch.cuda.synchronize()  # the last launched step's kernels belong in the trace
        out.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(out))
        return window
    if profiler == "cuda-api":
        torch.cuda.profiler.start()
        try:
            window = run_steps(core, load.steps, mark)
            torch.cuda.synchronize()
        finally:
            torch.cuda.profiler.stop()
        return window
    return run_steps(core, load.steps, nvtx_range)  # NVTX step marks only with CADENCE_NVTX=1


def _drain(core, ids: list[str]) -> None:
    core.abort_requests(ids)
    step = core.step_fn
    while core.has_work():
        step()


def trace(ns: argparse.Namespace) -> dict[str, Any]:
    """Build the engine, trace the load, and return the summary (with ``load`` and ``run``)."""
    if ns.profiler == "torch":  # the trace file, checked (its folder made) before the run
        made_output_file("--out", ns.out)
    load = _load(ns)
    core = make_engine(ns, load)
    cuda = core.config.device == "cuda"
    if ns.profiler == "cuda-api" and not cuda:
        raise SystemExit("--profiler cuda-api needs --device cuda")
    out = Path(ns.out)
    try:
        ids = add_requests(core, load)
        warm = run_steps(core, load.warmup_steps, make_nvtx_range(False))
        if warm.steps < load.warmup_steps:
            raise SystemExit("the load finished during warm-up; raise --output-len")
        window = _measure(core, load, ns.profiler, out, cuda)
        _drain(core, ids)
    finally:
        core.shutdown()
    traced = ns.profiler == "torch"
    summary: dict[str, Any] = summarize(out) if traced else {"num_steps": window.steps}
    summary["load"] = {
        **asdict(load),
        "model": ns.model,
        "device": core.config.device,
        "dtype": str(core.dtype),
        "async_scheduling": core.batch_queue_size > 1,
        "enforce_eager": core.config.enforce_eager,
        "profiler": ns.profiler,
        "trace": str(out) if traced else None,
    }
    summary["run"] = {
        "steps": window.steps,
        "ms_per_step": window.elapsed_s / max(window.steps, 1) * 1e3,
        "tokens": window.tokens,
        "tokens_per_s": window.tokens / window.elapsed_s if window.elapsed_s > 0 else None,
    }
    if ns.summary_out:
        Path(ns.summary_out).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def run(argv: list[str] | None = None) -> dict[str, Any]:
    return trace(build_parser().parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    # A mistake in the flags (an unknown model, a bad sampling value, a model length past the
    # model's) is one line, as the cadence commands' (user_errors).
    with one_line_errors(PROG):
        summary = trace(ns)
    if ns.json:
        print(json.dumps(summary, indent=1))
        return 0
    load, r = summary["load"], summary["run"]
    print(
        f"load: model={load['model']} device={load['device']} batch={load['batch_size']} "
        f"input={load['input_len']} async={load['async_scheduling']} "
        f"eager={load['enforce_eager']} profiler={load['profiler']}"
    )
    note = " (host clock, profiler attached)" if load["profiler"] != "none" else ""
    print(
        f"measured: {r['steps']} steps, {r['ms_per_step']:.3f} ms/step{note}, "
        f"{r['tokens_per_s'] or 0:.1f} tokens/s"
    )
    if load["trace"]:
        print(f"trace: {load['trace']}")
        print(format_summary(summary))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main())
