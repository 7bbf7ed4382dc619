"""`cadence bench throughput`: offline generation of many requests, tokens per second."""

from __future__ import annotations

import time

from cadence.bench.common import (
    Record,
    device_name,
    fit_context,
    git_commit,
    now,
    random_prompts,
    workload_problem,
)
from cadence.bench.report import add_report_args, emit
from cadence.cli_config import add_config_arg, parse_with_config
from cadence.cli_types import int_at_least
from cadence.user_errors import ArgumentParser


def main(argv: list[str] | None = None) -> int:
    from cadence.engine.engine_args import EngineArgs
    from cadence.engine.llm import LLM
    from cadence.sampling_params import SamplingParams

    p = ArgumentParser(prog="cadence bench throughput")
    EngineArgs.add_cli_args(p)
    p.add_argument("--num-prompts", type=int_at_least(1), default=64)
    p.add_argument("--input-len", type=int_at_least(1), default=128)
    p.add_argument("--output-len", type=int_at_least(1), default=128)
    add_report_args(p)
    add_config_arg(p)
    ns = parse_with_config(p, argv)
    args = EngineArgs.from_cli_args(ns)
    args.skip_tokenizer_init = True
    problem = (fit_context(args, ns.input_len + ns.output_len, "--input-len + --output-len")
               or workload_problem(ns.num_prompts, ns.input_len))
    if problem is not None:
        p.error(problem)
    llm = LLM(**vars(args))
    core = llm.engine_core
    prompts = [{"prompt_token_ids": t}
               for t in random_prompts(ns.num_prompts, ns.input_len, core.vocab_size)]
    params = SamplingParams(temperature=0.0, max_tokens=ns.output_len, ignore_eos=True)
    # The warm-up's prompts are others (seed 1): no timed prompt finds its blocks cached.
    warm = random_prompts(min(4, ns.num_prompts), ns.input_len, core.vocab_size, seed=1)
    llm.generate([{"prompt_token_ids": t} for t in warm], SamplingParams(max_tokens=4),
                 use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=not (ns.no_progress or ns.json))
    elapsed = time.perf_counter() - start
    gen = sum(len(o.outputs[0].token_ids) for o in outs)
    figures = {
        "num_prompts": ns.num_prompts, "input_len": ns.input_len, "output_len": ns.output_len,
        "elapsed_s": round(elapsed, 3),
        "requests_per_s": round(len(outs) / elapsed, 3),
        "output_tokens_per_s": round(gen / elapsed, 1),
        "total_tokens_per_s": round((gen + ns.num_prompts * ns.input_len) / elapsed, 1),
        "async_scheduling": core.batch_queue_size > 1,
        "enforce_eager": args.enforce_eager,
    }
    rec = Record("throughput", args.model, device_name(), git_commit(), now(), figures)
    emit(rec, ns, [figures])
    return 0
