"""Every environment switch cadence reads, in one place."""

from __future__ import annotations

import functools
import logging
import os
import warnings
from dataclasses import dataclass

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(name: str) -> bool | None:
    """A switch's value: None when unset or empty; anything but the words for on or off reads
    as off, with a warning naming the variable (a typo must not pass silently; raising here
    would stop every command, which all read the switches before they can report errors)."""
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    word = value.strip().lower()
    if word not in _TRUE and word not in _FALSE:
        _warn_unknown(name, value)
    return word in _TRUE


@functools.cache
def _warn_unknown(name: str, value: str) -> None:
    # NOTE: once per process: read_envs has many callers, and library imports between them
    # reset the registry that Python's own once-per-place filter relies on.
    warnings.warn(f"{name}={value!r} is neither on ({'/'.join(_TRUE)}) nor off "
                  f"({'/'.join(_FALSE)}); read as off.", stacklevel=4)


@functools.cache
def _logging_level(text: str) -> int:
    # NOTE: cached, so that an unknown level warns once per process (as _warn_unknown).
    value = text.strip()
    if value.isascii() and value.isdigit():
        return int(value)
    level = logging.getLevelName(value.upper() or "INFO")
    if isinstance(level, int):
        return level
    warnings.warn(f"CADENCE_LOG_LEVEL={text!r} is not a logging level (DEBUG, INFO, WARNING, "
                  "ERROR, CRITICAL or a number); read as INFO.", stacklevel=4)
    return logging.INFO


@dataclass(frozen=True)
class Envs:
    # Overrides the default of async scheduling (on) when async_scheduling is not given.
    async_scheduling: bool | None
    # Where the built-in tiny model is written on first use.
    cache_dir: str
    # Emit NVTX ranges around engine phases (schedule, prepare, forward, sample, copy, update).
    nvtx: bool
    log_level: str
    # CADENCE_CPU_THREADS as given ("" when unset); parsed by ``cpu_threads``.
    cpu_threads_text: str
    # The API key ``cadence serve`` requires when --api-key is not given: CADENCE_API_KEY, or
    # VLLM_API_KEY (vLLM's name, so that a vLLM deployment's key keeps its server closed);
    # "" for none.
    api_key: str = ""
    # Tensor parallelism on CUDA: every all-reduce through NCCL, none through the one-shot
    # kernel over peer-mapped buffers (model/custom_all_reduce.py).
    disable_custom_all_reduce: bool = False
    # Leave every decoder projection to cuBLAS (no skinny GEMM kernel for few-row steps).
    disable_skinny_gemm: bool = False
    # Keep SwiGLU a kernel of its own before the skinny down projection (not in its loads).
    disable_skinny_glu: bool = False
    # Keep the decoder's (residual add +) RMSNorms kernels of their own before the skinny qkv
    # and gate_up projections (not in their loads).
    disable_fused_norm: bool = False
    # Keep a one-token step's o_proj, post-attention norm and MLP three projections' kernels of
    # their own (no one-launch MLP block, model/mlp_block.py).
    disable_mlp_block: bool = False
    # Keep one-row bfloat16 projections on the skinny GEMM / cuBLAS instead of the bulk-copy
    # GEMV (model/bulk_gemv.py) where its table lists the shape.
    disable_bulk_gemv: bool = False
    # Launch one-token steps' kernels (skinny projections, decode attention and its merge, the
    # MLP block) as ordinary launches instead of programmatic dependent ones
    # (runtime/triton_launch.py's ``pdl_enabled``).
    disable_pdl: bool = False
    # Keep the q/k norms and RoPE of decode steps a kernel of their own before attention, and
    # the K/V store of other steps a kernel of its own after them.
    disable_fused_rope: bool = False
    # Run every eager step's forward as it is: no launch tapes (graphs/tapes.py) for decode
    # steps that no CUDA graph runs.
    disable_launch_tapes: bool = False
    # Attend every prefill through the paged varlen kernel, also a lone prompt from position
    # 0 (no dense cuDNN attention over the pass's own keys, model/dense_prefill.py).
    disable_dense_prefill: bool = False
    # Attend such a prompt through cuDNN alone (not the Triton kernel of short query blocks
    # while its causal work is small, model/causal_attention.py).
    disable_triton_dense_prefill: bool = False
    # Keep the narrow projections of 5-256 row steps whole cuBLAS products instead of K-split
    # partial sums that the next RMSNorm adds up (model/split_k.py).
    disable_split_k: bool = False
    # Run a prefill step's last layer for every token (not, past its qkv projection, for the
    # tokens the step samples from only; model/attention_metadata.py's ``OutputRows``).
    disable_output_rows: bool = False
    # Where start_profile / stop_profile write torch-profiler traces (cadence/torch_profiler.py):
    # CADENCE_TORCH_PROFILER_DIR, or VLLM_TORCH_PROFILER_DIR (vLLM's name); "" for off.
    torch_profiler_dir: str = ""
    # What the profiler records besides the ops (torch.profiler.profile's options; unset: the
    # default, shapes on and the rest off): CADENCE_TORCH_PROFILER_RECORD_SHAPES, _WITH_STACK,
    # _WITH_FLOPS and _WITH_PROFILE_MEMORY, or vLLM's VLLM_TORCH_PROFILER_* of the same names.
    torch_profiler_options: tuple[tuple[str, bool], ...] = ()

    @property
    def logging_level(self) -> int:
        """CADENCE_LOG_LEVEL as ``logging`` takes it (a name such as DEBUG, or a number); one
        it does not know reads as INFO, with a warning naming the variable (every command sets
        the level before it can report errors in one line)."""
        return _logging_level(self.log_level)

    @property
    def cpu_threads(self) -> int | None:
        """torch intra-op threads on the CPU backend when cpu_threads is not given. A value that
        is no integer raises here, where it is used, not in ``read_envs`` (which every command
        calls, e.g. for the log level, before it can report errors in one line)."""
        value = self.cpu_threads_text.strip()
        if not value:
            return None
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"CADENCE_CPU_THREADS must be an integer, got {value!r}.") from None


def read_envs() -> Envs:
    return Envs(
        async_scheduling=_flag("CADENCE_ASYNC_SCHEDULING"),
        cache_dir=os.environ.get("CADENCE_CACHE_DIR")
        or os.path.join(os.path.expanduser("~"), ".cache", "cadence"),
        nvtx=bool(_flag("CADENCE_NVTX")),
        log_level=os.environ.get("CADENCE_LOG_LEVEL", "INFO"),
        cpu_threads_text=os.environ.get("CADENCE_CPU_THREADS", ""),
        api_key=os.environ.get("CADENCE_API_KEY") or os.environ.get("VLLM_API_KEY") or "",
        disable_custom_all_reduce=bool(_flag("CADENCE_DISABLE_CUSTOM_ALL_REDUCE")),
        disable_skinny_gemm=bool(_flag("CADENCE_DISABLE_SKINNY_GEMM")),
        disable_skinny_glu=bool(_flag("CADENCE_DISABLE_SKINNY_GLU")),
        disable_fused_norm=bool(_flag("CADENCE_DISABLE_FUSED_NORM")),
        disable_fused_rope=bool(_flag("CADENCE_DISABLE_FUSED_ROPE")),
        disable_mlp_block=bool(_flag("CADENCE_DISABLE_MLP_BLOCK")),
        disable_bulk_gemv=bool(_flag("CADENCE_DISABLE_BULK_GEMV")),
        disable_pdl=bool(_flag("CADENCE_DISABLE_PDL")),
        disable_launch_tapes=bool(_flag("CADENCE_DISABLE_LAUNCH_TAPES")),
        disable_dense_prefill=bool(_flag("CADENCE_DISABLE_DENSE_PREFILL")),
        disable_triton_dense_prefill=bool(_flag("CADENCE_DISABLE_TRITON_DENSE_PREFILL")),
        disable_split_k=bool(_flag("CADENCE_DISABLE_SPLIT_K")),
        disable_output_rows=bool(_flag("CADENCE_DISABLE_OUTPUT_ROWS")),
        torch_profiler_dir=os.environ.get("CADENCE_TORCH_PROFILER_DIR")
        or os.environ.get("VLLM_TORCH_PROFILER_DIR") or "",
        torch_profiler_options=_profiler_options(),
    )


# torch.profiler.profile's option for each vLLM profiler switch (VLLM_TORCH_PROFILER_<NAME>).
_PROFILER_OPTIONS = {"RECORD_SHAPES": "record_shapes", "WITH_STACK": "with_stack",
                     "WITH_FLOPS": "with_flops", "WITH_PROFILE_MEMORY": "profile_memory"}


def _profiler_options() -> tuple[tuple[str, bool], ...]:
    found = []
    for name, option in _PROFILER_OPTIONS.items():
        value = _flag(f"CADENCE_TORCH_PROFILER_{name}")
        if value is None:
            value = _flag(f"VLLM_TORCH_PROFILER_{name}")
        if value is not None:
            found.append((option, value))
    return tuple(found)
