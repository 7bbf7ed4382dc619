"""Shared pieces of the offline benchmarks: workload, roofline, reporting."""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from cadence.bench.report import MEASURED_BANDWIDTH
from cadence.config import AUTO_MAX_MODEL_LEN

# Measured on one H200 (sum-reduction read bandwidth); the roofline of a memory-bound step.
H200_READ_BANDWIDTH = MEASURED_BANDWIDTH["H200"]


def git_commit() -> str:
    """The commit of the cadence that runs: its checkout's, else the one pip recorded when it
    installed cadence from a repository, else "unknown"."""
    package_dir = Path(__file__).resolve().parent.parent
    try:
        return subprocess.run(["git", "-C", str(package_dir), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        pass
    try:
        from importlib.metadata import distribution

        info = json.loads(distribution("cadence").read_text("direct_url.json") or "{}")
        commit = info.get("vcs_info", {}).get("commit_id")
        return commit[:7] if commit else "unknown"
    except Exception:
        return "unknown"


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"


# The most prompt tokens a benchmark builds up front (a list of Python ints: ~30 GB at 10^9).
MAX_WORKLOAD_TOKENS = 100_000_000


def workload_problem(num_prompts: int, input_len: int) -> str | None:
    """Why ``num_prompts`` prompts of ``input_len`` tokens are too many to build, or None."""
    if num_prompts * input_len <= MAX_WORKLOAD_TOKENS:
        return None
    return (f"--num-prompts {num_prompts} x --input-len {input_len} is more than "
            f"{MAX_WORKLOAD_TOKENS:,} prompt tokens to build.")


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(10, max(11, vocab - 1), size=(n, length)).tolist()


def weight_bytes(model, tokens: int = 1) -> int:
    """Bytes a step of ``tokens`` tokens (a decode batch, or a prompt) must read: every
    parameter except the input embedding table (only a few rows of it are touched), unless it is
    tied to the output head, which reads all of it. A mixture of experts reads the experts its
    tokens are routed to: with top-k of E experts and routing spread evenly, each expert is
    missed by all ``tokens`` with probability (1 - k / E) ** tokens."""
    tied = model.lm_head is None
    arch = model.arch
    touched = 1.0
    if arch.num_experts:
        touched = 1.0 - (1.0 - arch.num_experts_per_tok / arch.num_experts) ** tokens
    total = 0.0
    for name, p in model.named_parameters():
        if tied or "embed_tokens" not in name:
            size = p.numel() * p.element_size()
            total += size * touched if ".experts." in name else size
    return int(total)


def kv_bytes_per_token(model, dtype_size: int) -> int:
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * dtype_size


@dataclass
class Record:
    bench: str
    model: str
    device: str
    commit: str
    date: str
    figures: dict

    def dump(self) -> str:
        return json.dumps(asdict(self))


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


def median(xs: Iterable[float]) -> float:
    """The median, NaN for no values (a generator is taken whole first)."""
    values = list(xs)
    return statistics.median(values) if values else float("nan")


def fit_context(args, needed: int, what: str, limit: int | None = None) -> str | None:
    """Give ``args`` (EngineArgs) a context of ``needed`` tokens (a little more where the model
    has it) unless ``--max-model-len`` was given; the reason it cannot be (for the parser's
    one-line error) or None. ``what`` names the flags that ask for ``needed``; ``limit``: the
    model's context where the caller has read it already (``model_context``). "auto" (-1) is
    left to the engine: it needs ``needed`` tokens of KV cache then."""
    if args.max_model_len == AUTO_MAX_MODEL_LEN:
        return None
    if args.max_model_len is not None:
        if args.max_model_len < needed:
            return (f"--max-model-len {args.max_model_len} is below {what} ({needed}): a timed "
                    "request would not fit")
        return None
    if limit is None:
        limit = model_context(args)
    if needed > limit:
        return f"{what} ({needed}) is more than the model's context ({limit} tokens)"
    args.max_model_len = min(needed + 16, limit)
    return None


def model_context(args) -> int:
    """The model's own context length (its config; nothing is loaded)."""
    from cadence.model.registry import resolve_model

    return resolve_model(args.model, None, args.tokenizer, args.generation_config,
                         args.hf_overrides, args.override_generation_config).max_model_len
