"""``cadence bench serve``: load an OpenAI-compatible server with streaming completions.

For each request rate and concurrency level, ``--num-prompts`` requests of ``--input-len``
prompt tokens and ``--output-len`` generated tokens are sent, arriving as a Poisson process of
``--request-rate`` requests per second (``inf``: all at once; ``--burstiness`` other than 1:
gamma-distributed gaps, burstier or more even) with at most ``--concurrency`` in
flight; the report gives TTFT, TPOT, ITL and end-to-end latency (mean, median, std, p50 / p90 /
p99, max) and request / token throughput as JSON, under vLLM's ``bench serve`` names
(``mean_ttft_ms``, ``median_itl_ms``, ...); ``--plot FILE.png`` draws the latency percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import random
import statistics
import sys
from typing import Any

import httpx

from cadence.bench.common import git_commit, now, workload_problem
from cadence.bench.report import output_file, plot_file, positive_float, table
from cadence.bench.serve_client import RequestResult, Send, Target, run_in_processes, run_requests
from cadence.cli_config import add_config_arg, parse_with_config
from cadence.cli_types import int_at_least
from cadence.user_errors import ArgumentParser

PERCENTILES = (50, 90, 99)


def make_prompts(kind: str, num: int, input_len: int, seed: int | str) -> list[Any]:
    """Prompts of exactly ``input_len`` tokens (token-id prompts) or ~that many words."""
    rng = random.Random(seed)
    if kind == "tokens":
        # Ids in a range every real vocabulary covers; each prompt differs (no prefix-cache hits).
        return [[rng.randrange(10, 250) for _ in range(input_len)] for _ in range(num)]
    words = ["alpha", "beta", "gamma", "delta", "sigma", "omega", "kappa", "theta"]
    return [" ".join(rng.choice(words) for _ in range(input_len)) for _ in range(num)]


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(
    results: list[RequestResult],
    duration: float,
    concurrency: int | None,
    request_rate: float = math.inf,
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itls = [v for r in ok for v in r.itl]
    report: dict[str, Any] = {
        "request_rate": "inf" if math.isinf(request_rate) else request_rate,
        "concurrency": concurrency,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": out_tokens / duration if duration else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration else 0.0,
    }
    for name, values in (
        ("ttft", [r.ttft for r in ok]),
        ("tpot", tpots),
        ("itl", itls),
        ("e2el", [r.latency for r in ok]),
    ):
        report[f"mean_{name}_ms"] = statistics.fmean(values) * 1e3 if values else 0.0
        # vLLM's bench serve names: the median and the population standard deviation.
        report[f"median_{name}_ms"] = statistics.median(values) * 1e3 if values else 0.0
        report[f"std_{name}_ms"] = statistics.pstdev(values) * 1e3 if values else 0.0
        for p in PERCENTILES:
            report[f"p{p}_{name}_ms"] = _pct(values, p) * 1e3
        report[f"max_{name}_ms"] = max(values) * 1e3 if values else 0.0
    errors = sorted({r.error for r in results if not r.ok})
    if errors:
        report["errors"] = errors[:5]
    return report


def arrival_offsets(num: int, rate: float, seed: int, burstiness: float = 1.0) -> list[float]:
    """Seconds from the start at which each of ``num`` requests is sent, the first at 0: gaps
    drawn from a gamma distribution of mean ``1 / rate`` and shape ``burstiness`` (1: a Poisson
    process; below 1 burstier, above 1 more even; seeded), then scaled so that their mean is
    exactly ``1 / rate``: the run offers the rate asked for, not a random one near it, as vLLM's
    ``bench serve`` (which also delays the first request by a gap, and so sends the last at
    N / rate rather than (N - 1) / rate here). All at 0 for an infinite rate."""
    if math.isinf(rate) or num <= 1:
        return [0.0] * num
    rng = random.Random(seed)
    t, out = 0.0, [0.0]
    for _ in range(num - 1):
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        out.append(t)
    scale = (num - 1) / rate / t if t > 0 else 1.0
    return [x * scale for x in out]


def run_level(
    args: argparse.Namespace,
    concurrency: int | None,
    prompts: list[Any],
    request_rate: float = math.inf,
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    target = Target(args.base_url.rstrip("/") + "/v1/completions", headers, args.timeout)
    cap = concurrency or len(prompts)
    offsets = arrival_offsets(len(prompts), request_rate, args.seed, args.burstiness)
    payload = {
        "model": args.model,
        "max_tokens": args.output_len,
        "min_tokens": args.output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sends = [
        Send({**payload, "prompt": p}, len(p) if isinstance(p, list) else args.input_len, o)
        for p, o in zip(prompts, offsets, strict=True)
    ]
    if args.clients > 1:
        results, duration = run_in_processes(target, sends, cap, args.clients)
    else:
        results, start, end = asyncio.run(run_requests(target, sends, cap))
        duration = end - start
    return summarize(results, duration, concurrency, request_rate)


def _resolve_model(args: argparse.Namespace) -> str:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    resp = httpx.get(args.base_url.rstrip("/") + "/v1/models", timeout=30.0, headers=headers)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.model is None:
        args.model = _resolve_model(args)
    rates = parse_rates(args.request_rate)
    if args.concurrency is None:
        # Arrivals by rate: no cap on requests in flight unless asked; all at once: the classic
        # concurrency sweep.
        levels: list[int | None] = [None] if any(not math.isinf(r) for r in rates) else [1, 8, 32]
    else:
        levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    commit, date = git_commit(), now()
    reports = []
    for index, (rate, level) in enumerate(itertools.product(rates, levels)):
        report = _run_one_level(args, rate, level, index)
        report.update(commit=commit, date=date)
        reports.append(report)
        if args.json:
            print(json.dumps(report), flush=True)
    if not args.json:
        print(f"bench serve · {args.model} · {args.base_url} · commit {commit} · {date}")
        print(table([_row(r) for r in reports]), flush=True)
    return reports


# The columns of the default table (the JSON has every figure).
_TABLE_KEYS = ("request_rate", "concurrency", "completed", "failed", "duration_s",
               "request_throughput", "output_throughput", "p50_ttft_ms", "p99_ttft_ms",
               "p50_tpot_ms", "p50_itl_ms", "p90_itl_ms", "p99_itl_ms")


def _row(report: dict[str, Any]) -> dict[str, Any]:
    keys = [k for k in _TABLE_KEYS if k in report] or list(report)
    return {k: report[k] for k in keys}


def concurrency_levels(text: str) -> str:
    """``--concurrency``: comma-separated caps, each at least 1 (checked with the arguments)."""
    parts = [c.strip() for c in str(text).split(",") if c.strip()]
    if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated whole numbers of at least 1, got {text!r}")
    return text


# Below this many requests a second a run never ends (one request a ~12 days); past this
# burstiness the gamma draws of the arrival gaps do not return.
MIN_REQUEST_RATE = 1e-6
MAX_BURSTINESS = 1e6


def bounded_burstiness(text: str) -> float:
    value = positive_float(text)
    if value > MAX_BURSTINESS:
        raise argparse.ArgumentTypeError(f"at most {MAX_BURSTINESS:g}, got {text!r}")
    return value


def parse_rates(spec: str) -> list[float]:
    rates = []
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            rate = math.inf if part.lower() == "inf" else float(part)
        except ValueError:
            raise ValueError(f"--request-rate: {part!r} is not a number (or inf)") from None
        if not (rate >= MIN_REQUEST_RATE or math.isinf(rate)):
            raise ValueError(f"--request-rate: rates must be at least {MIN_REQUEST_RATE:g} "
                             f"requests/s, or inf, got {part!r}")
        rates.append(rate)
    if not rates:
        raise ValueError(f"--request-rate: no rate in {spec!r}")
    return rates


def _run_one_level(args: argparse.Namespace, rate: float, level: int | None,
                   index: int = 0) -> dict:
    """Run ``index`` of the sweep: its own prompts, and warm-up prompts of its own, so that no
    measured request finds its prompt in the server's prefix cache."""
    prompts = make_prompts(args.prompt_kind, args.num_prompts, args.input_len,
                           f"{args.seed}:{index}:measured")
    if args.warmup:
        n = min(level or args.warmup, args.warmup, len(prompts))
        run_level(args, n, make_prompts(args.prompt_kind, n, args.input_len,
                                        f"{args.seed}:{index}:warm-up"))
    report = run_level(args, level, prompts, rate)
    report.update(
        model=args.model,
        base_url=args.base_url,
        num_prompts=args.num_prompts,
        input_len=args.input_len,
        output_len=args.output_len,
        burstiness=args.burstiness,
    )
    return report


def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="default: the first of /v1/models")
    parser.add_argument("--api-key", default=None)
    parser.add_argument(
        "--concurrency",
        default=None,
        type=concurrency_levels,
        help="comma-separated caps on requests in flight (default: 1,8,32 when all arrive at "
        "once, no cap with a request rate)",
    )
    parser.add_argument(
        "--request-rate",
        default="inf",
        help="comma-separated arrival rates, requests/s (Poisson unless --burstiness); "
        "inf = all at once",
    )
    parser.add_argument(
        "--burstiness",
        type=bounded_burstiness,
        default=1.0,
        help="shape of the gamma-distributed gaps between arrivals: 1 = Poisson, below 1 "
        "burstier, above 1 more even (vLLM's option)",
    )
    parser.add_argument("--num-prompts", type=int_at_least(1), default=64)
    parser.add_argument("--input-len", type=int_at_least(1), default=128)
    parser.add_argument("--output-len", type=int_at_least(1), default=128)
    parser.add_argument(
        "--prompt-kind",
        choices=("tokens", "text"),
        default="tokens",
        help="tokens: exact-length token-id prompts; text: random words",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=1,
        help="client processes that share the load (so that the client is not the limit at "
        "hundreds of streams)",
    )
    parser.add_argument("--warmup", type=int_at_least(0), default=1,
                        help="warm-up requests per level")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=positive_float, default=600.0)
    parser.add_argument("--json", action="store_true",
                        help="print each level's report as a JSON line instead of a table")
    parser.add_argument("--json-out", default=None, type=output_file,
                        help="write all reports to this file")
    parser.add_argument("--plot", default=None, type=plot_file,
                        help="draw the latency percentiles to FILE.png")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = add_cli_args(ArgumentParser(prog="cadence bench serve", description=__doc__))
    add_config_arg(parser)
    args = parse_with_config(parser, argv)
    return run_from_args(args)


def run_from_args(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    try:
        parse_rates(args.request_rate)
    except ValueError as exc:
        print(f"cadence bench serve: error: {exc}", file=sys.stderr)
        return 2
    if args.clients < 1:
        print(f"cadence bench serve: error: --clients must be at least 1, got {args.clients}",
              file=sys.stderr)
        return 2
    problem = workload_problem(args.num_prompts, args.input_len)
    if problem is not None:
        print(f"cadence bench serve: error: {problem}", file=sys.stderr)
        return 2
    try:
        httpx.URL(args.base_url)  # its port too
    except httpx.InvalidURL as exc:
        print(f"cadence bench serve: error: --base-url {args.base_url!r}: {exc}",
              file=sys.stderr)
        return 2
    try:
        reports = run(args)
    except httpx.HTTPError as exc:
        print(f"cadence bench serve: error: {args.base_url}: {exc!r}", file=sys.stderr)
        return 2
    if args.plot:
        from cadence.bench.plot import plot_latency

        plot_latency(reports, args.plot)
    if args.json_out:
        with open(args.json_out, "w") as f:
            # The key stays out of a file that is shared with the figures.
            saved = {**vars(args), "api_key": "<set>" if args.api_key else None}
            json.dump({"reports": reports, "args": _plain(saved)}, f, indent=2)
    failed = sum(r["failed"] for r in reports)
    if failed:
        reasons = sorted({e for r in reports for e in r.get("errors", [])})
        print(f"{failed} request(s) failed: {'; '.join(reasons[:5])}", file=sys.stderr)
    return 1 if failed else 0


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if isinstance(v, (str, int, float, bool, type(None)))}


__all__ = ["RequestResult", "add_cli_args", "main", "make_prompts", "summarize"]
