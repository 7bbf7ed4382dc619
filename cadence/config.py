"""Engine configuration: one frozen dataclass per concern, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEDULING_POLICIES = ("fcfs", "priority")
LOAD_FORMATS = ("auto", "dummy", "safetensors")
DTYPES = ("auto", "float32", "float16", "bfloat16")
# vLLM's other spellings (--dtype half / float), resolved to the names above by EngineArgs.
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
QUANTIZATION_METHODS = ("fp8",)  # --quantization (None: weights in the model dtype)
# What a request's logprobs are of (vLLM's --logprobs-mode): the model's logits as they come
# ("raw_"), or as sampled after penalties, temperature, min-p, top-k and top-p ("processed_").
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
# The most tokens a KV block holds: past it one block outgrows what a cache is given (a
# larger --block-size is a mistake, not a tuning; vLLM offers at most 256).
MAX_BLOCK_SIZE = 4096
KV_CACHE_DTYPES = ("auto", "fp8")  # "auto": the model dtype; "fp8": e4m3 with per-layer scales
# Sequences in flight: the runner's per-sequence buffers are sized by it at start-up (3,000,000
# asked for ~46 GiB of host arrays); far past what any step can batch.
MAX_NUM_SEQS = 65536
# A step's tokens: the step buffers are sized by it (a typo of many digits asked the allocator
# for petabytes); 2**24 is past any model's context, which it must reach without chunking.
MAX_NUM_BATCHED_TOKENS = 1 << 24
# max_model_len -1 (vLLM's "auto"): the model's context, lowered at start-up to the tokens the
# KV cache holds where it holds fewer.
AUTO_MAX_MODEL_LEN = -1


# The reasoning parsers' tags (vLLM's parsers of these names): a reasoning block is the text
# between them. The server's parsers split answers at them; the engine's thinking budgets
# count the tokens inside them.
REASONING_TAGS: dict[str, tuple[str, str]] = {
    "qwen3": ("<think>", "</think>"),
    "deepseek_r1": ("<think>", "</think>"),
}


@dataclass(frozen=True)
class ModelConfig:
    model: str = "tiny"
    dtype: str = "auto"
    load_format: str = "auto"
    seed: int = 0
    skip_tokenizer_init: bool = False
    max_model_len: int | None = None  # None: the checkpoint's max_position_embeddings
    tokenizer: str | None = None  # None: the model directory's own tokenizer (if any)
    # Most logprobs a request may ask for per token (vLLM's default 20; -1: the vocabulary).
    max_logprobs: int = 20
    quantization: str | None = None  # one of QUANTIZATION_METHODS, or None
    logprobs_mode: str = "raw_logprobs"  # one of LOGPROBS_MODES
    reasoning_parser: str | None = None  # one of REASONING_TAGS: thinking budgets' tags

    def __post_init__(self) -> None:
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_TAGS:
            raise ValueError(f"reasoning_parser {self.reasoning_parser!r} is not known; use one "
                             f"of {', '.join(sorted(REASONING_TAGS))}.")
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS} or None, got "
                             f"{self.quantization!r}.")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got "
                             f"{self.logprobs_mode!r}.")
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be -1 or more, got {self.max_logprobs}.")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}.")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}.")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be at least 1, got {self.max_model_len}.")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None
    # Bytes of KV cache (per device), instead of what gpu_memory_utilization leaves (vLLM's).
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    cache_dtype: str = "auto"  # one of KV_CACHE_DTYPES

    def __post_init__(self) -> None:
        if self.cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"cache_dtype must be one of {KV_CACHE_DTYPES}, got "
                             f"{self.cache_dtype!r}.")
        if not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"block_size must be 1 to {MAX_BLOCK_SIZE} tokens, got "
                             f"{self.block_size}.")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 2:
            raise ValueError(
                "num_gpu_blocks_override must be at least 2 (block 0 is reserved), got "
                f"{self.num_gpu_blocks_override}."
            )
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError("kv_cache_memory_bytes must be at least 1, got "
                             f"{self.kv_cache_memory_bytes}.")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}."
            )


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    policy: str = "fcfs"
    async_scheduling: bool = False
    enable_chunked_prefill: bool = True
    # A prompt longer than this is scheduled at most this many tokens a step, so that one long
    # prompt does not take a whole step's budget from shorter ones (vLLM's); 0: no cap.
    long_prefill_token_threshold: int = 0
    # vLLM's: streamed outputs every this many new tokens (and the first and the last) for
    # requests whose SamplingParams.stream_interval is None; fewer, larger stream chunks.
    stream_interval: int = 1

    def __post_init__(self) -> None:
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be at least 1, got {self.stream_interval}.")
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {self.policy!r}."
            )
        if not 1 <= self.max_num_seqs <= MAX_NUM_SEQS:
            raise ValueError(f"max_num_seqs must be 1 to {MAX_NUM_SEQS}, got {self.max_num_seqs}.")
        if not 1 <= self.max_num_batched_tokens <= MAX_NUM_BATCHED_TOKENS:
            raise ValueError(f"max_num_batched_tokens must be 1 to {MAX_NUM_BATCHED_TOKENS}, "
                             f"got {self.max_num_batched_tokens}.")
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be at least 1, got {self.max_model_len}.")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be at least 0, "
                             f"got {self.long_prefill_token_threshold}.")
        if self.long_prefill_token_threshold and not self.enable_chunked_prefill:
            raise ValueError("long_prefill_token_threshold splits prompts over several steps: "
                             "it needs chunked prefill (enable_chunked_prefill=True).")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "max_num_batched_tokens must be at least max_model_len when chunked prefill is off."
            )

    @property
    def max_concurrent_batches(self) -> int:
        return 2 if self.async_scheduling else 1


@dataclass(frozen=True)
class GraphConfig:
    """Which steps replay as CUDA graphs.

    Decode steps (one token per request) replay a graph per batch-size bucket; mixed steps
    (any prefill) replay a graph per token-count bucket up to ``max_capture_tokens`` (0: mixed
    steps run eagerly). ``emulate`` runs the same bucketing and padding on a device without
    graphs (every "replay" re-runs the step eagerly on the padded buffers): a test aid.
    """

    enforce_eager: bool = False
    max_capture_tokens: int = 2048
    emulate: bool = False

    def __post_init__(self) -> None:
        if self.max_capture_tokens < 0:
            raise ValueError(
                f"max_capture_tokens must be at least 0, got {self.max_capture_tokens}."
            )


@dataclass(frozen=True)
class ParallelConfig:
    """How the model is split over devices: ``tensor_parallel_size`` ranks, one process each
    (1: the model runs in the engine's own process, as without this config)."""

    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"tensor_parallel_size must be at least 1, got {self.tensor_parallel_size}."
            )


def resolved_dtype(dtype: str, device: str) -> str:
    """``dtype`` ("auto", "float32", "float16" or "bfloat16") by name, "auto" resolved."""
    if dtype == "auto":
        return "bfloat16" if device == "cuda" else "float32"
    return dtype


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine core needs, resolved (no 'auto' left except in model.dtype)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = "cpu"
    graphs: GraphConfig = field(default_factory=GraphConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}.")

    @property
    def enforce_eager(self) -> bool:
        return self.graphs.enforce_eager

    @property
    def dtype(self) -> str:
        """The weights' dtype by name, "auto" resolved (bfloat16 on CUDA, float32 on the CPU)."""
        return resolved_dtype(self.model.dtype, self.device)

    @property
    def use_graphs(self) -> bool:
        """Whether the runner captures graphs (or emulates them) at start-up."""
        if self.graphs.enforce_eager:
            return False
        return self.device == "cuda" or self.graphs.emulate
