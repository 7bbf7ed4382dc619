"""The `cadence` command: generate, serve, bench."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from cadence.envs import read_envs
from cadence.user_errors import one_line_errors

_BENCHES = {
    "latency": "cadence.bench.latency",
    "throughput": "cadence.bench.throughput",
    "serve": "cadence.bench.serve",
    "scheduler": "cadence.bench.scheduler",
    "ttft": "cadence.bench.ttft",
}


def _generate(ns: argparse.Namespace) -> int:
    from cadence.engine.engine_args import EngineArgs
    from cadence.engine.llm import LLM
    from cadence.sampling_params import SamplingParams

    args = EngineArgs.from_cli_args(ns)
    llm = LLM(**vars(args))
    params = SamplingParams(temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k,
                            max_tokens=ns.max_tokens, seed=ns.sampling_seed, stop=ns.stop or None)
    prompts = ns.prompt or ["Hello, my name is"]
    for out in llm.generate(prompts, params, use_tqdm=False):
        completion = out.outputs[0]
        if ns.show_prompt or len(prompts) > 1:
            print(f"--- prompt: {out.prompt!r}")
        print(completion.text if llm.get_tokenizer() is not None else completion.token_ids)
        if ns.verbose:
            print(f"[{len(completion.token_ids)} tokens, finish_reason={completion.finish_reason}]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from cadence.engine.engine_args import EngineArgs

    parser = argparse.ArgumentParser(prog="cadence", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate completions for prompts and print them")
    EngineArgs.add_cli_args(gen)
    gen.add_argument("--prompt", action="append", help="a prompt (repeat for several)")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--sampling-seed", type=int, default=None)
    gen.add_argument("--stop", action="append")
    gen.add_argument("--show-prompt", action="store_true")
    gen.add_argument("-v", "--verbose", action="store_true")
    gen.set_defaults(func=_generate)

    from cadence.server.cli import add_serve_parser

    add_serve_parser(sub)

    bench = sub.add_parser("bench", help="benchmarks: " + ", ".join(_BENCHES))
    bench.add_argument("which", choices=sorted(_BENCHES))
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)
    return parser


def _bench(ns: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(_BENCHES[ns.which])
    return int(module.main(ns.rest) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=read_envs().log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    ns = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    prog = f"cadence {ns.command}" + (f" {ns.which}" if ns.command == "bench" else "")
    with one_line_errors(prog):
        return int(ns.func(ns) or 0)


if __name__ == "__main__":
    sys.exit(main())
