"""`cadence bench ttft`: time to first token of one request by prompt length, offline.

Each measurement adds one request (a fresh random prompt, so no prefix-cache hit) with
``max_tokens=1`` to an idle engine and times until its token is on the host: scheduling, input
upload, the prefill step (a graph replay or eager), sampling and the copy back. The floor is the
larger of the weight read (bytes / bandwidth) and the prefill's matmul work (FLOPs / peak; FP8
weights at twice the peak).
"""

from __future__ import annotations

import argparse
import time

from cadence.bench.common import (
    Record,
    device_name,
    fit_context,
    git_commit,
    median,
    model_context,
    now,
    random_prompts,
    weight_bytes,
)
from cadence.bench.report import (
    add_report_args,
    emit,
    positive_float,
    progress,
    read_bandwidth,
)
from cadence.cli_config import add_config_arg, parse_with_config
from cadence.cli_types import int_at_least, int_list_at_least
from cadence.config import AUTO_MAX_MODEL_LEN
from cadence.user_errors import ArgumentParser

DEFAULT_LENS = (16, 128, 1024, 4096)
# Dense bf16 tensor-core throughput measured on one H200 (matrix work), FLOP/s.
H200_BF16_FLOPS = 790e12


def _parser() -> argparse.ArgumentParser:
    from cadence.engine.engine_args import EngineArgs

    p = ArgumentParser(prog="cadence bench ttft")
    EngineArgs.add_cli_args(p)
    p.add_argument("--input-lens", type=int_list_at_least(1), default=None,
                   help=f"prompt lengths (default: {','.join(map(str, DEFAULT_LENS))}, those the "
                   "model's context holds)")
    p.add_argument("--repeats", type=int_at_least(1), default=10)
    p.add_argument("--flops", type=positive_float, default=None,
                   help="matmul FLOP/s for the floor (default: the measured H200 bf16 figure "
                   "on an H200; none elsewhere)")
    add_report_args(p, bandwidth=True)
    add_config_arg(p)
    return p


def time_one(core, prompt: list[int], request_id: str) -> float:
    """Seconds from adding one request (max_tokens=1) to its token on the host."""
    from cadence.core_types import EngineCoreRequest
    from cadence.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    start = time.perf_counter()
    core.add_request(EngineCoreRequest(request_id, prompt, params))
    step = core.step_fn
    while True:
        outs, _ = step()
        if outs is not None and any(o.new_token_ids for o in outs.outputs):
            elapsed = time.perf_counter() - start
            break
    while core.has_work():  # drain the batch queue (async scheduling)
        step()
    return elapsed


def matmul_seconds(model, num_tokens: int, flops: float) -> float:
    """The GEMM work of a ``num_tokens`` prefill at ``flops`` (bf16 / the model dtype; FP8
    projections at twice that, the H200's dense FP8 to bf16 ratio). Every token multiplies by the
    decoder's weights and by k of the E experts'; the LM head runs for the sampled row only.
    Attention is left out (small next to the GEMMs at these lengths)."""
    arch = model.arch
    active = arch.num_experts_per_tok / arch.num_experts if arch.num_experts else 1.0
    tied = model.lm_head is None
    seconds = 0.0
    for name, p in model.named_parameters():
        if p.dim() < 2 or name.endswith("_scale") or ("embed_tokens" in name and not tied):
            continue  # norms, biases and scales; the input embedding is a lookup
        head = name.startswith("lm_head") or "embed_tokens" in name
        rows = 1 if head else num_tokens
        share = active if ".experts." in name else 1.0
        # FP8 projections run FP8 GEMMs in prefill; FP8 experts run weight-only (bf16 MMA).
        fp8_gemm = str(p.dtype).startswith("torch.float8") and ".experts." not in name
        rate = 2.0 * flops if fp8_gemm else flops
        seconds += 2.0 * p.numel() * share * rows / rate
    return seconds


def floor_seconds(model, num_tokens: int, bandwidth: float, flops: float) -> float:
    """The larger of the weight read and the GEMM work."""
    return max(weight_bytes(model, num_tokens) / bandwidth, matmul_seconds(model, num_tokens, flops))


def main(argv: list[str] | None = None) -> int:
    from cadence.engine.core import EngineCore
    from cadence.engine.engine_args import EngineArgs

    parser = _parser()
    ns = parse_with_config(parser, argv)
    args = EngineArgs.from_cli_args(ns)
    lens, limit = ns.input_lens, None
    if lens is None:  # the defaults the model's context holds (a prompt and its one token)
        given = args.max_model_len not in (None, AUTO_MAX_MODEL_LEN)
        limit = None if given else model_context(args)
        room = args.max_model_len if given else limit
        if room < 2:
            parser.error(f"--max-model-len {room} leaves no room for a prompt and its token.")
        lens = [n for n in DEFAULT_LENS if n + 1 <= room] or [room - 1]
    problem = fit_context(args, max(lens) + 1, "the longest --input-lens and its token", limit)
    if problem is not None:
        parser.error(problem)
    args.max_num_seqs = min(args.max_num_seqs, 8)
    if args.max_num_batched_tokens is None:
        args.max_num_batched_tokens = max(8192, max(lens))
    args.skip_tokenizer_init = True
    start = time.perf_counter()
    core = EngineCore(args)
    startup = time.perf_counter() - start
    runner = core.runner
    model = runner.model
    device = device_name()
    bandwidth = read_bandwidth(ns.bandwidth, device)
    flops = ns.flops if ns.flops is not None else (H200_BF16_FLOPS if "H200" in device else None)
    results = []
    for length in progress(lens, ns, "prompt lengths"):
        prompts = random_prompts(ns.repeats + 2, length, core.vocab_size, seed=length)
        time_one(core, prompts[0], f"warm-{length}-0")
        time_one(core, prompts[1], f"warm-{length}-1")
        times = [time_one(core, p, f"t{length}-{i}") for i, p in enumerate(prompts[2:])]
        ms = median(times) * 1e3
        graph = runner.mixed_graphs is not None and runner.mixed_graphs.bucket_for(length)
        row = {"input_len": length, "ttft_ms_p50": round(ms, 3),
               "ttft_ms_min": round(min(times) * 1e3, 3),
               "ttft_ms_max": round(max(times) * 1e3, 3)}
        if bandwidth is not None and flops is not None:
            floor_ms = floor_seconds(model, length, bandwidth, flops) * 1e3
            row.update(floor_ms=round(floor_ms, 3), ratio=round(floor_ms / ms, 3))
        row["graph_bucket"] = graph or None
        results.append(row)
    settings = {"startup_s": round(startup, 2), "capture_s": round(runner.capture_seconds, 2),
                "enforce_eager": args.enforce_eager,
                "max_capture_tokens": core.config.graphs.max_capture_tokens,
                "async_scheduling": core.batch_queue_size > 1}
    rec = Record("ttft", args.model, device, git_commit(), now(), {**settings, "rows": results})
    emit(rec, ns, results, settings)
    core.shutdown()
    return 0
