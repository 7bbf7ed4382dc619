"""Where the host time of engine steps goes, by function (cProfile), for one steady load.

    python scripts/host_profile.py --model qwen3-0.6b --load-format dummy --enforce-eager \
        --batch-size 1 --steps 50 [--prefill-len 0] [--top 30]

Runs ``--steps`` decode steps at ``--batch-size`` (or, with ``--prefill-len L``, steps that each
prefill one new L-token prompt) after a warm-up, under cProfile, and prints the wall time per
step and the functions with the most own time per step.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from cadence.bench.common import random_prompts
    from cadence.core_types import EngineCoreRequest
    from cadence.engine.core import EngineCore
    from cadence.engine.engine_args import EngineArgs
    from cadence.sampling_params import SamplingParams

    p = argparse.ArgumentParser()
    EngineArgs.add_cli_args(p)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--prefill-len", type=int, default=0)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"),
                   help="order of the functions listed (pstats' keys)")
    ns = p.parse_args()
    args = EngineArgs.from_cli_args(ns)
    args.skip_tokenizer_init = True
    if args.max_model_len is None:
        args.max_model_len = 2048
    core = EngineCore(args)
    step = core.step_fn
    long = SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    if ns.prefill_len:
        prompts = random_prompts(ns.steps + 5, ns.prefill_len, core.vocab_size, seed=1)

        def work(i: int) -> None:
            core.add_request(EngineCoreRequest(f"p{i}", prompts[i], one))
            step()
    else:
        for i, prompt in enumerate(random_prompts(ns.batch_size, 64, core.vocab_size)):
            core.add_request(EngineCoreRequest(f"d{i}", prompt, long))

        def work(i: int) -> None:
            step()

    for i in range(5):
        work(i)
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    for i in range(5, 5 + ns.steps):
        work(i)
    prof.disable()
    wall = (time.perf_counter() - start) / ns.steps
    print(f"wall per step under cProfile: {wall * 1e3:.3f} ms "
          f"(eager={args.enforce_eager}, batch={ns.batch_size}, prefill={ns.prefill_len})")
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats(ns.sort).print_stats(ns.top)
    print(out.getvalue())
    core.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
