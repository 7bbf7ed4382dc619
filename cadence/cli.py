"""The cadence command: generate completions, serve an OpenAI-compatible API, benchmark, trace."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from cadence.cli_config import add_config_arg, dashed, expand_config, flags_with_config
from cadence.envs import read_envs
from cadence.user_errors import ArgumentParser, flags_given, one_line_errors

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

    # Each flag given wins; a field left unset takes the generation config's default
    # (--generation-config), else greedy decoding of up to 32 tokens.
    given = {k: v for k, v in (("temperature", ns.temperature), ("top_p", ns.top_p),
                               ("top_k", ns.top_k), ("max_tokens", ns.max_tokens))
             if v is not None}
    fallback = {"temperature": 0.0, "max_tokens": 32}
    extra = {"seed": ns.sampling_seed, "stop": ns.stop or None}
    SamplingParams(**{**fallback, **given}, **extra)  # a mistaken flag fails before the load
    args = EngineArgs.from_cli_args(ns)
    llm = LLM(**vars(args))
    defaults = llm.engine_core.spec.generation_defaults
    params = SamplingParams(**{**fallback, **defaults, **given}, **extra)
    prompts = ns.prompt or ["Hello, my name is"]
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.shutdown()  # tensor-parallel workers stop before the command ends
    for out in outs:
        completion = out.outputs[0]
        if ns.show_prompt or len(prompts) > 1:
            print(f"--- prompt: {out.prompt!r}")
        print(completion.text if llm.get_tokenizer() is not None else completion.token_ids)
        if ns.verbose:
            print(f"[{len(completion.token_ids)} tokens, finish_reason={completion.finish_reason}]")
    return 0


def cadence_version() -> str:
    """The installed package's version, else the source tree's."""
    from importlib import metadata

    try:
        return metadata.version("cadence")
    except metadata.PackageNotFoundError:
        from cadence import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    from cadence.engine.engine_args import EngineArgs

    parser = ArgumentParser(prog="cadence", description=__doc__)
    parser.add_argument("--version", action="version", version=f"cadence {cadence_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate completions for prompts and print them",
                         description="Generate completions for prompts with the offline engine "
                                     "(vLLM's LLM.generate) and print them.")
    add_config_arg(gen)
    EngineArgs.add_cli_args(gen)
    gen.add_argument("--prompt", action="append",
                     help="a prompt (repeat for several) (default: 'Hello, my name is')")
    gen.add_argument("--max-tokens", type=int, default=None,
                     help="most tokens to generate per prompt (default: the generation "
                          "config's max_new_tokens, else 32)")
    gen.add_argument("--temperature", type=float, default=None,
                     help="sampling temperature; 0 = greedy (default: the generation config's, "
                          "else 0)")
    gen.add_argument("--top-p", type=float, default=None,
                     help="nucleus sampling: keep the most likely tokens up to this "
                          "probability mass (default: the generation config's, else 1)")
    gen.add_argument("--top-k", type=int, default=None,
                     help="keep the k most likely tokens; -1 = all (default: the generation "
                          "config's, else all)")
    gen.add_argument("--sampling-seed", type=int, default=None,
                     help="seed of each request's sampling, for repeatable output "
                          "(default: none)")
    gen.add_argument("--stop", action="append",
                     help="a stop string, not included in the output (repeat for several)")
    gen.add_argument("--show-prompt", action=argparse.BooleanOptionalAction, default=False,
                     help="print each prompt before its completion")
    gen.add_argument("-v", "--verbose", action=argparse.BooleanOptionalAction, default=False,
                     help="print each completion's token count and finish reason")
    gen.set_defaults(func=_generate)

    from cadence.server.cli import add_serve_parser

    add_serve_parser(sub)

    bench = sub.add_parser("bench", help="benchmarks: " + ", ".join(_BENCHES))
    names = sorted(_BENCHES)
    bench.add_argument("which", choices=names, metavar="{" + ",".join(names) + "}")
    # Named as the usage line shows them, for argparse's "arguments are required" message.
    bench.add_argument("rest", nargs=argparse.REMAINDER, metavar="OPTIONS")
    bench.set_defaults(func=_bench)

    trace = sub.add_parser("trace", add_help=False,
                           help="an HTML report of where each engine step's time goes")
    trace.add_argument("rest", nargs=argparse.REMAINDER)
    trace.set_defaults(func=_trace)
    return parser


def _bench(ns: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(_BENCHES[ns.which])
    return int(module.main(ns.rest) or 0)


def _trace(ns: argparse.Namespace) -> int:
    from cadence.trace.cli import main

    return int(main(ns.rest) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    prog = "cadence " + " ".join(args[:2] if args[:1] == ["bench"] else args[:1])
    interrupt = _Interrupt()
    previous = interrupt.install()
    try:
        logging.basicConfig(level=read_envs().logging_level,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        seen = interrupt.was_seen
        if args[:1] == ["trace"]:  # its own parser: argparse's REMAINDER drops leading options
            with one_line_errors("cadence trace", seen, engine_flags(args)):
                return _trace(argparse.Namespace(rest=dashed(args[1:])))
        with one_line_errors(prog.rstrip(), seen):  # a bad --config file
            ns = parse_args(args)
        prog = f"cadence {ns.command}" + (f" {ns.which}" if ns.command == "bench" else "")
        with one_line_errors(prog, seen, engine_flags(args, ns.command)):
            return int(ns.func(ns) or 0)
    except BaseException as exc:
        # Ctrl-C while the command starts or runs (a server serving takes SIGINT over).
        if not (interrupt.seen or isinstance(exc, KeyboardInterrupt)):
            raise
        print(f"{prog.rstrip()}: interrupted", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        # NOTE: not SystemExit: the engine thread (a daemon) may be inside torch, and the
        # interpreter's teardown under it aborts the process (SIGABRT).
        os._exit(130)
    finally:
        interrupt.uninstall(previous)


def engine_flags(argv: Sequence[str], command: str | None = None
                 ) -> Callable[[], dict[str, str]]:
    """The field -> flag map of the flags in ``argv`` (the engine's, and ``command``'s own, as
    ``serve``'s ``port``), made on an error: a one-line error that names a field names the flag
    too."""
    def flags() -> dict[str, str]:
        from cadence.engine.engine_args import EngineArgs

        sub = _subcommands(build_parser()).get(command) if command is not None else None

        def found(args: list[str]) -> dict[str, str]:
            own = flags_given(sub, args) if sub is not None else {}
            return {**own, **EngineArgs.cli_flags(args)}

        if sub is None or command not in ("generate", "serve"):  # those that read --config
            return found(dashed(argv))
        return flags_with_config(sub, argv[1:], found)
    return flags


class _Interrupt:
    """SIGINT as Python's own handler takes it (a ``KeyboardInterrupt``), remembered: a library
    that catches the interrupt inside an import may fail later on its half-made modules (torch's
    lazy imports end in a ``RecursionError``), and whatever then ends the command reads as the
    interruption it was, not as that error's traceback."""

    def __init__(self) -> None:
        self.seen = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.seen = True
        raise KeyboardInterrupt

    def was_seen(self) -> bool:
        return self.seen

    def install(self) -> Any:
        """Take SIGINT where Python's default handler has it (not where it is ignored, nor off
        the main thread); returns the handler to restore."""
        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
            return None
        return signal.signal(signal.SIGINT, self)

    def uninstall(self, previous: Any) -> None:
        if previous is not None and signal.getsignal(signal.SIGINT) is self:
            signal.signal(signal.SIGINT, previous)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` as ``cadence`` reads it: option names may have underscores, and the options of
    a ``--config`` file come before the command line's (``ValueError`` for a mistake there)."""
    parser = build_parser()
    args = list(argv)
    if args and args[0] in ("generate", "serve"):
        args = [args[0], *expand_config(_subcommands(parser)[args[0]], args[1:])]
    elif args:  # bench: underscores too (its engine options are serve's)
        args = [args[0], *dashed(args[1:])]
    ns, extra = parser.parse_known_args(args)
    if extra:  # named by the command's own parser ("cadence serve: error: ...")
        command = _subcommands(parser).get(args[0]) if args else None
        (command or parser).error("unrecognized arguments: " + " ".join(extra))
    return ns


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public lookup
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


if __name__ == "__main__":
    sys.exit(main())
