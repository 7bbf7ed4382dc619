"""EngineArgs: every knob LLM(...), AsyncLLM and `cadence serve` accept, resolved into configs."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from cadence.compilation_config import graph_settings
from cadence.config import (
    DTYPE_ALIASES,
    LOGPROBS_MODES,
    QUANTIZATION_METHODS,
    CacheConfig,
    EngineConfig,
    GraphConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
)
from cadence.engine.engine_cli import add_engine_cli_args
from cadence.envs import read_envs
from cadence.hf_overrides import check_hf_overrides
from cadence.user_errors import flags_given

if TYPE_CHECKING:
    from cadence.hf_overrides import HfOverrides

logger = logging.getLogger(__name__)

_DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
_DEFAULT_MAX_CAPTURE_TOKENS = 8192
# Below this many parameters one CPU thread is fastest (measured: the built-in tiny model).
SMALL_CPU_MODEL_PARAMS = 100_000_000
# torch's thread pool crashes the process (SIGSEGV) when asked for ~100,000 threads; far more
# than any machine has cores, so a larger request is a mistake, not a tuning choice.
MAX_CPU_THREADS = 4096
# vLLM's spellings of the FP8 KV cache; e5m2 is refused (no kernels store it).
_KV_CACHE_DTYPE_ALIASES = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8"}


# Fields whose vLLM default is None ("choose for me"): None here is the field's default.
_NONE_IS_DEFAULT = frozenset({"max_num_seqs", "block_size", "enable_prefix_caching",
                              "enable_chunked_prefill"})


def _no_mm_items(limit: object) -> bool:
    """A ``limit_mm_per_prompt`` value that allows no items: 0, None, or vLLM's dict form with
    a count of 0 (``{"count": 0, "width": 512}``); an empty dict sets nothing."""
    if isinstance(limit, dict):
        limit = limit.get("count", 0)
    return limit is None or (type(limit) is int and limit == 0)


@dataclass
class EngineArgs:
    model: str = "tiny"
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    # Mixed (prefill) steps up to this many tokens replay CUDA graphs; 0: only decode graphs.
    # None: min(max_num_batched_tokens, 8192).
    max_capture_tokens: int | None = None
    emulate_graphs: bool = False  # test aid: bucketing and padding without CUDA graphs
    # AsyncLLM / cadence serve: run the engine core in a process of its own (not a thread).
    engine_process: bool = False
    async_scheduling: bool | None = None
    scheduling_policy: str = "fcfs"
    load_format: str = "auto"
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    # Most tokens of one prompt in a step (0: no cap beyond the step's budget).
    long_prefill_token_threshold: int = 0
    # Streamed outputs every this many tokens, for requests that leave stream_interval unset.
    stream_interval: int = 1
    # A tokenizer directory other than the model's ("tiny": the built-in model's tokenizer).
    tokenizer: str | None = None
    # Default sampling fields: "auto" (the model's generation_config.json), "vllm" (none), a DIR;
    # vLLM's override_generation_config sets some of them ({"temperature": 0.5}).
    generation_config: str = "auto"
    override_generation_config: dict | None = None
    skip_tokenizer_init: bool = False
    # Accepted as vLLM does; cadence runs only its built-in architectures, never remote code.
    trust_remote_code: bool = False
    # vLLM's hub revision: cadence never downloads, so any value is an error.
    revision: str | None = None
    # Weight quantization ("fp8": e4m3 weights with per-channel scales, dynamic per-token
    # activation scales) and the KV-cache dtype ("fp8" / "fp8_e4m3": e4m3), vLLM's names.
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    seed: int | None = 0  # None: a random seed
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None  # the KV cache's size, instead of the profile's
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    device: str = "auto"
    # torch intra-op threads on the CPU backend (None: CADENCE_CPU_THREADS, else by model size).
    cpu_threads: int | None = None
    # Most logprobs a request may ask for per token (-1: as many as the vocabulary has).
    max_logprobs: int = 20
    # What logprobs are of: raw_logprobs (default), raw_logits, processed_logprobs,
    # processed_logits (after penalties, temperature, min-p, top-k and top-p), as in vLLM.
    logprobs_mode: str = "raw_logprobs"
    # Ranks the model is split over, one worker process each (1: no worker process).
    tensor_parallel_size: int = 1
    # vLLM's: the reasoning parser whose tags bound a thinking budget (thinking_token_budget);
    # `cadence serve --reasoning-parser` sets it too.
    reasoning_parser: str | None = None
    # vLLM's, taken so that code written for it runs: disable_log_stats=False keeps the offline
    # engine's statistics for LLM.get_metrics() (periodic stats are never logged; the server's
    # /metrics is always served), and preemption recomputes (vLLM v1's), so no CPU swap space
    # is used; the tokenizer is always transformers' ("auto").
    disable_log_stats: bool = True
    swap_space: float = 0.0
    tokenizer_mode: str = "auto"
    # vLLM's: fields set on the model's config.json as loaded (a dict; from Python also a
    # function of the config), e.g. {"max_position_embeddings": 4096} or a rope_scaling.
    hf_overrides: HfOverrides | None = None
    # vLLM's: an optimization level or CompilationConfig fields; its CUDA-graph options map
    # onto enforce_eager and max_capture_tokens (cadence.compilation_config).
    compilation_config: int | dict | None = None
    # vLLM's, taken where they ask for what cadence does (code written for vLLM passes them):
    # a generating model, one pipeline stage, worker processes of its own ("mp"; "uni": none),
    # no adapters, no sleep mode; other values are a one-line error. served_model_name is the
    # server's (--served-model-name); offline it names nothing.
    task: str = "auto"
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    enable_lora: bool = False
    enable_sleep_mode: bool = False
    limit_mm_per_prompt: dict | None = None  # vLLM's: text only here (no items or all 0)
    served_model_name: str | list | None = None

    def __post_init__(self) -> None:
        self._check_types()
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        if self.revision is not None:
            raise ValueError(
                f"revision={self.revision!r}: cadence never downloads models, so --revision has "
                "no meaning here; pass a local model directory checked out at that revision."
            )
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(
                f"quantization={self.quantization!r} is not supported; supported: "
                f"{', '.join(QUANTIZATION_METHODS)}; leave it unset for weights in --dtype."
            )
        if self.tokenizer_mode not in ("auto", "hf"):
            raise ValueError(f"tokenizer_mode={self.tokenizer_mode!r} is not supported; "
                             "supported: auto (transformers' tokenizer; hf is its alias).")
        if not 0.0 <= self.swap_space <= 1e6:
            raise ValueError(f"swap_space must be a size in GiB >= 0, got {self.swap_space}.")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode={self.logprobs_mode!r} is not supported; supported: "
                f"{', '.join(LOGPROBS_MODES)}.")
        if self.cpu_threads is not None:  # refused on any device, not only where it is used
            _checked_cpu_threads(self.cpu_threads)
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"tensor_parallel_size must be at least 1, got {self.tensor_parallel_size}."
            )
        if self.seed is None:  # vLLM's "no fixed seed": a fresh one each run
            self.seed = int.from_bytes(os.urandom(8), "little") >> 1
        # What torch's generators take (an integer: _check_types).
        if not -(1 << 63) <= self.seed < 1 << 64:
            raise ValueError(f"seed must be an integer in [-2**63, 2**64), got {self.seed!r}.")
        check_hf_overrides(self.hf_overrides, self.engine_process)
        self._check_vllm_only_fields()
        self.enforce_eager, self.max_capture_tokens = graph_settings(
            self.compilation_config, self.enforce_eager, self.max_capture_tokens)
        if self.kv_cache_dtype not in _KV_CACHE_DTYPE_ALIASES:
            raise ValueError(
                f"kv_cache_dtype={self.kv_cache_dtype!r} is not supported; supported: "
                f"{', '.join(_KV_CACHE_DTYPE_ALIASES)} (auto: the model dtype; fp8 = fp8_e4m3)."
            )

    def _check_vllm_only_fields(self) -> None:
        if self.task not in ("auto", "generate"):
            raise ValueError(f"task={self.task!r} is not supported; cadence runs generative "
                             "models only (auto, generate).")
        if self.pipeline_parallel_size != 1:
            raise ValueError(f"pipeline_parallel_size={self.pipeline_parallel_size} is not "
                             "supported; split a model over GPUs with tensor_parallel_size.")
        backend = self.distributed_executor_backend
        if backend not in (None, "mp", "uni"):
            raise ValueError(f"distributed_executor_backend={backend!r} is not supported; "
                             "supported: mp (a process per tensor-parallel rank), uni (one "
                             "process: tensor_parallel_size 1), or None (either, by size).")
        if backend == "uni" and self.tensor_parallel_size > 1:
            raise ValueError("distributed_executor_backend='uni' runs one process: it needs "
                             f"tensor_parallel_size 1, got {self.tensor_parallel_size}.")
        if self.enable_lora:
            raise ValueError("enable_lora=True is not supported: cadence serves no adapters.")
        if self.enable_sleep_mode:
            raise ValueError("enable_sleep_mode=True is not supported: cadence has no sleep "
                             "mode.")
        limits = self.limit_mm_per_prompt
        if limits is not None and (not isinstance(limits, dict)
                                   or not all(map(_no_mm_items, limits.values()))):
            raise ValueError(f"limit_mm_per_prompt={limits!r}: cadence runs text-only models; "
                             "multimodal inputs are not supported (give none, or 0 of each).")
        names = self.served_model_name
        if names is not None and not (isinstance(names, str) or (
                isinstance(names, list) and all(isinstance(n, str) for n in names))):
            raise ValueError("served_model_name must be a name or a list of names, got "
                             f"{names!r}.")

    def _check_types(self) -> None:
        """Each field of its declared type (from Python, not the CLI, anything can arrive:
        ``enable_prefix_caching="no"`` read as true, ``block_size=16.5`` failed deep inside);
        integers and reals of other kinds (numpy's) become Python ones; None where vLLM's
        field defaults to None is the default, an empty reasoning parser (vLLM's default) none."""
        if self.reasoning_parser == "":
            self.reasoning_parser = None
        for f in fields(self):
            value, kind = getattr(self, f.name), str(f.type)
            if value is None and f.name in _NONE_IS_DEFAULT:  # vLLM's None: "the default"
                setattr(self, f.name, f.default)
                continue
            if value is None and kind.endswith("| None"):
                continue
            kind = kind.removesuffix(" | None")
            if kind == "bool" and not isinstance(value, bool):
                raise ValueError(f"{f.name} must be True or False, got {value!r}.")
            if kind == "int":
                if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                    raise ValueError(f"{f.name} must be an integer, got {value!r}.")
                setattr(self, f.name, int(value))
            if kind == "float":
                if isinstance(value, bool) or not isinstance(value, numbers.Real):
                    raise ValueError(f"{f.name} must be a number, got {value!r}.")
                setattr(self, f.name, float(value))
            if kind == "str" and isinstance(value, os.PathLike):  # a model or tokenizer path
                setattr(self, f.name, os.fspath(value))
            elif kind == "str" and not isinstance(value, str):
                raise ValueError(f"{f.name} must be a string, got {value!r}.")

    def resolve_cpu_threads(self, num_params: int) -> int:
        """Threads for the CPU backend: a model's matrices below ~100M parameters are too small
        to split (one thread is fastest, and immune to spin-waits on a busy machine); larger ones
        read memory faster with every usable core."""
        if self.cpu_threads is not None:
            return _checked_cpu_threads(self.cpu_threads)
        threads = read_envs().cpu_threads
        if threads is not None:
            return _checked_cpu_threads(threads, "CADENCE_CPU_THREADS")
        if num_params < SMALL_CPU_MODEL_PARAMS:
            return 1
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else (os.cpu_count() or 1))

    def resolve_device(self) -> str:
        import torch

        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "device='cuda' but this torch sees no CUDA device (CPU-only build or no GPU); "
                "use device='cpu' or 'auto'."
            )
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        visible = torch.cuda.device_count() if device == "cuda" else 0
        if device == "cuda" and self.tensor_parallel_size > visible:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} needs that many GPUs, but "
                f"{visible} {'is' if visible == 1 else 'are'} visible (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})."
            )
        return device

    def resolve_async_scheduling(self) -> bool:
        if self.async_scheduling is not None:
            return self.async_scheduling
        env = read_envs().async_scheduling
        return True if env is None else env

    def create_engine_config(self, max_model_len: int) -> EngineConfig:
        """``max_model_len`` is the resolved context length (the model registry decides it)."""
        batched = self.max_num_batched_tokens
        if batched is None:
            batched = self.default_max_num_batched_tokens(max_model_len)
        return EngineConfig(
            model=ModelConfig(model=self.model, dtype=self.dtype, load_format=self.load_format,
                              seed=self.seed, skip_tokenizer_init=self.skip_tokenizer_init,
                              max_model_len=max_model_len, tokenizer=self.tokenizer,
                              max_logprobs=self.max_logprobs,
                              logprobs_mode=self.logprobs_mode,
                              quantization=self.quantization,
                              reasoning_parser=self.reasoning_parser),
            cache=CacheConfig(block_size=self.block_size,
                              enable_prefix_caching=self.enable_prefix_caching,
                              num_gpu_blocks_override=self.num_gpu_blocks_override,
                              kv_cache_memory_bytes=self.kv_cache_memory_bytes,
                              gpu_memory_utilization=self.gpu_memory_utilization,
                              cache_dtype=_KV_CACHE_DTYPE_ALIASES[self.kv_cache_dtype]),
            scheduler=SchedulerConfig(max_num_seqs=self.max_num_seqs,
                                      max_num_batched_tokens=batched,
                                      max_model_len=max_model_len,
                                      policy=self.scheduling_policy,
                                      async_scheduling=self.resolve_async_scheduling(),
                                      enable_chunked_prefill=self.enable_chunked_prefill,
                                      long_prefill_token_threshold=(
                                          self.long_prefill_token_threshold),
                                      stream_interval=self.stream_interval),
            device=self.resolve_device(),
            graphs=GraphConfig(enforce_eager=self.enforce_eager,
                               max_capture_tokens=self.resolve_max_capture_tokens(batched),
                               emulate=self.emulate_graphs),
            parallel=ParallelConfig(tensor_parallel_size=self.tensor_parallel_size),
        )

    def default_max_num_batched_tokens(self, max_model_len: int) -> int:
        if not self.enable_chunked_prefill:  # a whole prompt must fit one step (as vLLM)
            return max(_DEFAULT_MAX_NUM_BATCHED_TOKENS, max_model_len)
        return max(_DEFAULT_MAX_NUM_BATCHED_TOKENS, min(max_model_len, 16384))

    def resolve_max_capture_tokens(self, max_num_batched_tokens: int) -> int:
        if self.max_capture_tokens is not None:
            if self.max_capture_tokens < 0:
                raise ValueError("max_capture_tokens must be at least 0, "
                                 f"got {self.max_capture_tokens}.")
            return min(self.max_capture_tokens, max_num_batched_tokens)
        return min(_DEFAULT_MAX_CAPTURE_TOKENS, max_num_batched_tokens)

    # CLI ------------------------------------------------------------------------------------
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, model_positional: bool = False
                     ) -> argparse.ArgumentParser:
        """Add the engine flags, with vLLM's names and meanings (``engine_cli``), and return
        ``parser`` (vLLM's ``parser = EngineArgs.add_cli_args(parser)``)."""
        add_engine_cli_args(parser, EngineArgs(), model_positional)
        return parser

    @staticmethod
    def cli_flags(argv: Sequence[str]) -> dict[str, str]:
        """Field -> the flag in ``argv`` that set it (``max_num_seqs``: ``--max-num-seqs``),
        for an error that names the field; the configs' names where they differ
        (``cache_dtype``). A field set by no flag given (derived, or a default) is left out:
        its error is not the flag's."""
        parser = argparse.ArgumentParser(add_help=False)
        EngineArgs.add_cli_args(parser)
        flags = flags_given(parser, argv)
        if "kv_cache_dtype" in flags:
            flags["cache_dtype"] = flags["kv_cache_dtype"]
        return flags

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> EngineArgs:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(ns).items() if k in names})


@dataclass
class AsyncEngineArgs(EngineArgs):
    """``EngineArgs`` for ``AsyncLLM`` (vLLM's): also whether it logs each request."""

    enable_log_requests: bool = False

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, model_positional: bool = False
                     ) -> argparse.ArgumentParser:
        """``EngineArgs``' flags and ``--enable-log-requests``; returns ``parser``."""
        EngineArgs.add_cli_args(parser, model_positional)
        parser.add_argument("--enable-log-requests", action="store_true",
                            help="log each request's start and end")
        return parser


def _checked_cpu_threads(threads: int, name: str = "cpu_threads") -> int:
    if not 1 <= threads <= MAX_CPU_THREADS:
        raise ValueError(f"{name} must be 1 to {MAX_CPU_THREADS}, got {threads}.")
    return threads
