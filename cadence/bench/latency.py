"""`cadence bench latency`: ms per decode step at fixed batch sizes, against the roofline."""

from __future__ import annotations

import argparse
import time

from cadence.bench.common import (
    Record,
    device_name,
    fit_context,
    git_commit,
    kv_bytes_per_token,
    median,
    now,
    random_prompts,
    weight_bytes,
)
from cadence.bench.report import add_report_args, emit, progress, read_bandwidth
from cadence.cli_config import add_config_arg, parse_with_config
from cadence.cli_types import int_at_least, int_list_at_least
from cadence.config import MAX_NUM_SEQS
from cadence.user_errors import ArgumentParser


def _parser() -> argparse.ArgumentParser:
    from cadence.engine.engine_args import EngineArgs

    p = ArgumentParser(prog="cadence bench latency")
    EngineArgs.add_cli_args(p)
    p.add_argument("--batch-sizes", type=int_list_at_least(1), default=[1, 8, 32])
    p.add_argument("--input-len", type=int_at_least(1), default=128)
    # The first output token closes the prefill, the second the first step timed from it.
    p.add_argument("--output-len", type=int_at_least(3, "two tokens before the first timed "
                                                     "decode step"), default=256)
    p.add_argument("--repeats", type=int_at_least(1), default=3)
    add_report_args(p, bandwidth=True)
    add_config_arg(p)
    p.set_defaults(max_num_seqs=None)  # the largest batch size unless given
    # argparse has no public lookup (as in cli_config)
    p._option_string_actions["--max-num-seqs"].help = (
        "most requests running in one step (default: the largest batch size)")
    return p


def _output_wait_s(core) -> float:
    """Seconds the engine has waited for step outputs so far (0 where the runner keeps no
    count, e.g. tensor parallelism)."""
    copier = getattr(core.runner, "copier", None)
    return float(getattr(copier, "wait_s", 0.0))


def run_batch(core, batch: int, input_len: int, output_len: int, seed: int
              ) -> list[tuple[float, float]]:
    """One round: `batch` requests prefilled together then decoded; returns the time of each
    decode step of the whole batch and the part of it the host spent waiting for the GPU's
    output. A step is timed from the previous step's output to its own, and only where both
    steps gave every request of the batch one token after its first: steps that carry a
    prefill chunk or follow a preemption, and steps after a request left early, are not
    decode steps at this batch size."""
    from cadence.core_types import EngineCoreRequest
    from cadence.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    ids = [f"b{batch}-{seed}-{i}" for i in range(batch)]
    for rid, prompt in zip(ids, random_prompts(batch, input_len, core.vocab_size, seed),
                           strict=True):
        core.add_request(EngineCoreRequest(rid, prompt, params))
    produced = dict.fromkeys(ids, 0)
    # (time, output wait so far, a decode step of the whole batch) per consumed step.
    stamps: list[tuple[float, float, bool]] = []
    step = core.step_fn
    while core.has_work():
        outs, _ = step()
        if outs is None:
            continue  # a step launched ahead (async scheduling): its output comes later
        now_s = time.perf_counter()
        new = {o.request_id: len(o.new_token_ids) for o in outs.outputs}
        decode = (len(new) == batch and all(n == 1 for n in new.values())
                  and all(produced.get(rid, 0) >= 1 for rid in new))
        for rid, n in new.items():
            produced[rid] = produced.get(rid, 0) + n
        stamps.append((now_s, _output_wait_s(core), decode))
    return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(stamps, stamps[1:]) if a[2] and b[2]]


def main(argv: list[str] | None = None) -> int:
    from cadence.engine.core import EngineCore
    from cadence.engine.engine_args import EngineArgs

    parser = _parser()
    ns = parse_with_config(parser, argv)
    batches = ns.batch_sizes
    if max(batches) > MAX_NUM_SEQS:
        parser.error(f"--batch-sizes: at most {MAX_NUM_SEQS} requests run in one step, got "
                     f"{max(batches)}")
    if ns.max_num_seqs is None:
        ns.max_num_seqs = max(batches)
    elif ns.max_num_seqs < max(batches):
        parser.error(f"--max-num-seqs {ns.max_num_seqs} is below the largest batch size "
                     f"{max(batches)}: each decode step timed runs the whole batch")
    args = EngineArgs.from_cli_args(ns)
    problem = fit_context(args, ns.input_len + ns.output_len, "--input-len + --output-len")
    if problem is not None:
        parser.error(problem)
    if args.max_num_batched_tokens is None:
        args.max_num_batched_tokens = max(8192, max(batches) * ns.input_len)
    args.skip_tokenizer_init = True
    started = time.perf_counter()
    core = EngineCore(args)
    startup_s = time.perf_counter() - started
    model = core.runner.model
    wbytes = weight_bytes(model)
    # An FP8 cache stores one byte per value.
    kv_tok = kv_bytes_per_token(model, getattr(core.runner, "kv_dtype", core.dtype).itemsize)
    device = device_name()
    bandwidth = read_bandwidth(ns.bandwidth, device)
    tp = args.tensor_parallel_size
    results = []
    for batch in progress(batches, ns, "batch sizes"):
        run_batch(core, batch, ns.input_len, min(ns.output_len, 8), seed=99)  # warm-up
        steps: list[tuple[float, float]] = []
        for r in range(ns.repeats):
            steps.extend(run_batch(core, batch, ns.input_len, ns.output_len, seed=r))
        times = [t for t, _ in steps]
        if not times:
            raise SystemExit(
                f"cadence bench latency: no decode step ran all {batch} requests at once (a "
                "prefill chunk or a preemption in every step): raise --max-num-batched-tokens "
                "or the KV cache, or lower the batch size.")
        step_s = median(times)
        # The host's own work per step: the step less its wait for the GPU's output. Near the
        # step time, the host sets the pace (a faster GPU step would not show).
        host_s = median(t - w for t, w in steps)
        avg_ctx = ns.input_len + ns.output_len / 2
        bytes_step = weight_bytes(model, batch) + batch * avg_ctx * kv_tok
        row = {
            "batch": batch,
            "decode_ms_per_step": round(step_s * 1e3, 4),
            "tokens_per_s": round(batch / step_s, 1),
            "bytes_per_step": int(bytes_step),
            "achieved_read_GBps": round(bytes_step / step_s / 1e9, 1),
        }
        if bandwidth is not None:
            # Tensor parallelism: each GPU reads its share of the bytes at its own bandwidth.
            roofline_s = bytes_step / tp / bandwidth
            row["roofline_ms"] = round(roofline_s * 1e3, 4)
            row["ratio_to_roofline"] = round(roofline_s / step_s, 4)
        row.update({
            "host_busy_ms_per_step": round(host_s * 1e3, 4),
            "steps_measured": len(times),
            "kernels_per_step": core.runner.kernels_per_step(batch)
            if hasattr(core.runner, "kernels_per_step") else None,
        })
        results.append(row)
    settings = {"input_len": ns.input_len, "output_len": ns.output_len, "dtype": str(core.dtype),
                "enforce_eager": args.enforce_eager,
                "async_scheduling": core.batch_queue_size > 1, "weight_bytes": wbytes,
                "tensor_parallel_size": tp, "startup_s": round(startup_s, 2),
                "bandwidth_Bps": bandwidth}
    rec = Record("latency", args.model, device, git_commit(), now(),
                 {**settings, "results": results})
    emit(rec, ns, results, settings)
    core.shutdown()
    return 0
