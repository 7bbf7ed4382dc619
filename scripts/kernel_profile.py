"""GPU time per kernel of one engine step, from the torch profiler (CUDA activities).

    python scripts/kernel_profile.py --model qwen3-0.6b --load-format dummy --enforce-eager \
        --prefill-lens 128,1024,4096 [--decode-batch 1] [--decode-context 64] [--steps 5] [--top 15]

For each prefill length, runs ``--steps`` steps that each prefill one fresh prompt (a decode
step at ``--decode-batch`` with ``--prefill-lens 0``), and prints the kernels with the most GPU
time per step: calls per step, us per call, us per step and share of the step's kernel time,
and its exposed time per call: the part of the kernel during which no earlier-started kernel was
still running (a kernel launched early that waits on its predecessor, as with programmatic
dependent launches, shows a long duration but a short exposed time).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _short(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def exposed_times(spans: list[tuple[float, float]]) -> list[float]:
    """For kernels' ``(start, end)`` spans, the time each adds to the union of those started
    before it: ``end - max(start, latest end so far)``, at least 0 (in ``spans``' order)."""
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    out = [0.0] * len(spans)
    reach = float("-inf")
    for i in order:
        start, end = spans[i]
        out[i] = max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return out


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from cadence.bench.common import random_prompts
    from cadence.core_types import EngineCoreRequest
    from cadence.engine.core import EngineCore
    from cadence.engine.engine_args import EngineArgs
    from cadence.sampling_params import SamplingParams

    p = argparse.ArgumentParser()
    EngineArgs.add_cli_args(p)
    p.add_argument("--prefill-lens", default="128,1024")
    p.add_argument("--decode-batch", type=int, default=1)
    p.add_argument("--decode-context", type=int, default=64,
                   help="prompt tokens of each decoding sequence (--prefill-lens 0)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=15)
    ns = p.parse_args()
    if not torch.cuda.is_available():
        print("kernel_profile.py needs a CUDA device", file=sys.stderr)
        return 2
    lens = [int(x) for x in ns.prefill_lens.split(",")]
    args = EngineArgs.from_cli_args(ns)
    args.skip_tokenizer_init = True
    if args.max_model_len is None:
        args.max_model_len = max(max(lens) + 16, 1024)
    if args.max_num_batched_tokens is None:
        args.max_num_batched_tokens = max(8192, max(lens))
    core = EngineCore(args)
    step = core.step_fn
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    long = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
    for length in lens:
        if length == 0:
            for i, prompt in enumerate(random_prompts(ns.decode_batch, ns.decode_context,
                                                       core.vocab_size)):
                core.add_request(EngineCoreRequest(f"d{i}", prompt, long))
            for _ in range(5):
                step()

            def work(i: int) -> None:
                step()
        else:
            prompts = random_prompts(ns.steps + 3, length, core.vocab_size, seed=length)

            def work(i: int, prompts=prompts, length=length) -> None:
                core.add_request(EngineCoreRequest(f"p{length}-{i}", prompts[i], one))
                while core.has_work():
                    step()

            for i in range(2):
                work(i)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(2, 2 + ns.steps):
                work(i)
            torch.cuda.synchronize()
        per: dict[str, list[float]] = defaultdict(list)
        gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        shown = defaultdict(list)
        spans = [(e.time_range.start, e.time_range.end) for e in gpu]
        for evt, exp in zip(gpu, exposed_times(spans), strict=True):
            per[evt.name].append(evt.device_time)
            shown[evt.name].append(exp)
        total = sum(sum(v) for v in per.values()) / ns.steps
        union = sum(sum(v) for v in shown.values()) / ns.steps
        label = f"prefill {length}" if length else f"decode batch {ns.decode_batch}"
        print(f"\n== {label}: {total:.0f} us of kernel time per step, "
              f"{sum(len(v) for v in per.values()) / ns.steps:.0f} kernels per step, "
              f"{union:.0f} us with a kernel running (exposed: us per call outside others)")
        rows = sorted(per.items(), key=lambda kv: -sum(kv[1]))[: ns.top]
        for name, times in rows:
            calls = len(times) / ns.steps
            us_step = sum(times) / ns.steps
            exposed = sum(shown[name]) / len(times)
            print(f"{calls:7.1f} x {sum(times) / len(times):8.2f} us = {us_step:9.1f} us "
                  f"({100 * us_step / total:4.1f}%)  exposed {exposed:7.2f}  {_short(name)}")
        if length == 0:
            core.abort_requests([f"d{i}" for i in range(ns.decode_batch)])
            while core.has_work():
                step()
    core.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
