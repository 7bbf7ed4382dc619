"""The engine's command-line flags (``EngineArgs.add_cli_args``): vLLM's names and meanings,
each with its default taken from ``EngineArgs``."""

from __future__ import annotations

import argparse
from typing import Any

from cadence.cli_config import json_object, json_object_or_int
from cadence.cli_types import (
    human_readable_int,
    human_readable_int_or_auto,
    int_at_least,
    int_or_none,
)
from cadence.config import DTYPE_ALIASES, DTYPES, LOGPROBS_MODES, SCHEDULING_POLICIES


def add_engine_cli_args(parser: argparse.ArgumentParser, d: Any, model_positional: bool = False
                        ) -> None:
    """Add the engine flags to ``parser``; ``d``: an ``EngineArgs()`` (the defaults), not
    imported here (it calls this)."""
    model_help = "HF model directory, a shape preset, or 'tiny' (default: %(default)s)"
    if model_positional:
        parser.add_argument("model", nargs="?", default=d.model, help=model_help)
    else:
        parser.add_argument("--model", default=d.model, help=model_help)
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="tokenizer directory to use instead of the model's ('tiny': the "
                             "built-in model's); lets a shape preset take text prompts "
                             "(default: the model directory's)")
    # No argparse choices: vLLM's other modes get the one-line error of __post_init__.
    parser.add_argument("--tokenizer-mode", default=d.tokenizer_mode, metavar="{auto,hf}",
                        help="vLLM's; transformers' tokenizer either way (default: "
                             "%(default)s)")
    parser.add_argument("--swap-space", type=float, default=d.swap_space, metavar="GIB",
                        help="vLLM's; accepted and unused: preemption recomputes, nothing "
                             "is swapped to the CPU (default: %(default)s)")
    parser.add_argument("--dtype", default=d.dtype,
                        choices=["auto", *DTYPE_ALIASES, *DTYPES[1:]],
                        help="weights and activations; half = float16, float = float32, "
                             "auto = bfloat16 on CUDA, float32 on the CPU "
                             "(default: %(default)s)")
    parser.add_argument("--max-model-len", type=human_readable_int_or_auto, default=None,
                        help="context length, prompt plus output; vLLM's suffixes: 1k = "
                             "1000, 1K = 1024, also m/M, g/G, t/T; auto (or -1): the model's, "
                             "lowered to what the KV cache holds (default: the model's "
                             "max_position_embeddings, times the factor of linear or yarn RoPE "
                             "scaling, as vLLM derives it)")
    parser.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs,
                        help="most requests running in one step (default: %(default)s)")
    parser.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None,
                        help="most tokens in one step (default: max(8192, max-model-len up "
                             "to 16384); without chunked prefill at least max-model-len)")
    _switch(parser, "enable-chunked-prefill", d.enable_chunked_prefill,
            "split long prompts over several steps, beside decodes (default: on)",
            "schedule each prompt whole in one step")
    parser.add_argument("--long-prefill-token-threshold", type=int_at_least(0),
                        default=d.long_prefill_token_threshold, metavar="N",
                        help="schedule at most N tokens of one prompt a step, leaving the "
                             "rest of the budget to other requests; 0 = no cap "
                             "(default: %(default)s)")
    parser.add_argument("--stream-interval", type=int_at_least(1),
                        default=d.stream_interval, metavar="N",
                        help="streamed outputs every N new tokens (and with the first and "
                             "the last) for requests that leave stream_interval unset: "
                             "fewer, larger stream chunks (default: %(default)s)")
    _switch(parser, "enable-prefix-caching", d.enable_prefix_caching,
            "reuse the KV blocks of earlier prompts' common prefixes (default: on)",
            "turn prefix caching off")
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=False,
                        help="run every step eagerly (no CUDA graphs; decode steps replay "
                             "their recorded kernel launches unless "
                             "CADENCE_DISABLE_LAUNCH_TAPES=1)")
    parser.add_argument("--max-capture-tokens", type=int_at_least(0), default=None,
                        help="capture mixed prefill/decode steps as CUDA graphs up to this "
                             "many tokens; 0 = decode graphs only (default: 8192)")
    _switch(parser, "async-scheduling", None,
            "schedule step N+1 while step N runs (default: on, or $CADENCE_ASYNC_SCHEDULING)",
            "schedule each step after the last one")
    parser.add_argument("--scheduling-policy", default=d.scheduling_policy,
                        choices=list(SCHEDULING_POLICIES),
                        help="which waiting request runs first: arrival order (a request's "
                             "priority is taken and ignored), or the request's priority "
                             "(default: %(default)s)")
    parser.add_argument("--load-format", default=d.load_format,
                        choices=["auto", "dummy", "safetensors"],
                        help="dummy = random weights of the model's shapes (needed for "
                             "shape presets) (default: %(default)s)")
    parser.add_argument("--generation-config", default=d.generation_config, metavar="SRC",
                        help="default temperature / top_p / top_k for requests that leave "
                             "them unset: 'auto' = the model's generation_config.json, "
                             "'vllm' = none, or a directory holding one "
                             "(default: %(default)s)")
    parser.add_argument("--override-generation-config", type=json_object, default=None,
                        metavar="JSON",
                        help="default sampling fields laid over --generation-config's, as a "
                             "JSON object, e.g. '{\"temperature\": 0.5}': merged with the "
                             "model's under 'auto', alone under 'vllm' (vLLM's)")
    parser.add_argument("--hf-overrides", type=json_object, default=None, metavar="JSON",
                        help="fields to set on the model's config.json as loaded, as a "
                             "JSON object, e.g. '{\"max_position_embeddings\": 4096}' "
                             "(a nested config is updated field by field)")
    parser.add_argument("--compilation-config", "-O", type=json_object_or_int,
                        default=None, metavar="JSON",
                        help="vLLM's compilation config, a level or a JSON object: its "
                             "cudagraph_mode (NONE = --enforce-eager, FULL_DECODE_ONLY = "
                             "--max-capture-tokens 0), max_cudagraph_capture_size and "
                             "cudagraph_capture_sizes (their largest caps the captured "
                             "steps) apply; levels and compiler options change nothing")
    parser.add_argument("--skip-tokenizer-init", action=argparse.BooleanOptionalAction,
                        default=False,
                        help="load no tokenizer: token-id prompts only, no text in outputs")
    parser.add_argument("--trust-remote-code", action=argparse.BooleanOptionalAction,
                        default=False,
                        help="accepted for vLLM compatibility and changes nothing: cadence "
                             "runs only its built-in architectures, never a model's own code")
    parser.add_argument("--revision", default=None,
                        help="not supported: cadence never downloads models, so giving it "
                             "is an error")
    parser.add_argument("--quantization", "-q", default=None, metavar="METHOD",
                        help="weight quantization: fp8 = e4m3 weights of the decoder "
                             "projections with per-channel scales and per-token activation "
                             "scales (CUDA compute capability 8.9+; emulated on the CPU); an "
                             "FP8 checkpoint on such a GPU runs in fp8 unless given "
                             "(default: weights in --dtype)")
    parser.add_argument("--kv-cache-dtype", default=d.kv_cache_dtype, metavar="DTYPE",
                        help="KV cache dtype: auto = the model dtype; fp8 (= fp8_e4m3) "
                             "stores keys and values in e4m3 with per-layer scales, twice the "
                             "tokens in the same memory (default: %(default)s)")
    parser.add_argument("--seed", type=int_or_none, default=d.seed,
                        help="random seed of dummy weights and unseeded sampling "
                             "(default: %(default)s)")
    parser.add_argument("--num-gpu-blocks-override", type=int_or_none, default=None,
                        help="KV cache blocks to allocate, instead of sizing the cache from "
                             "--gpu-memory-utilization")
    parser.add_argument("--kv-cache-memory-bytes", type=human_readable_int, default=None,
                        metavar="BYTES",
                        help="the KV cache's size in bytes per device (e.g. 4G), instead of "
                             "what --gpu-memory-utilization leaves (vLLM's; "
                             "--num-gpu-blocks-override wins over it)")
    parser.add_argument("--gpu-memory-utilization", type=float,
                        default=d.gpu_memory_utilization,
                        help="fraction of the GPU's memory for weights, activations and "
                             "KV cache (default: %(default)s; on the CPU the KV cache takes "
                             "at most 1 GiB, or --num-gpu-blocks-override blocks)")
    parser.add_argument("--block-size", type=int, default=d.block_size,
                        help="tokens per KV cache block (default: %(default)s)")
    parser.add_argument("--device", default=d.device, choices=["auto", "cpu", "cuda"],
                        help="auto = cuda when available (default: %(default)s)")
    parser.add_argument("--max-logprobs", type=int, default=d.max_logprobs,
                        help="most logprobs (completions) / top_logprobs (chat) a request "
                             "may ask for per token; -1 = the vocabulary size "
                             "(default: %(default)s)")
    parser.add_argument("--logprobs-mode", default=d.logprobs_mode, choices=LOGPROBS_MODES,
                        help="what logprobs are of: the model's logits as they come (raw_) "
                             "or as sampled, after penalties, temperature, min-p, top-k "
                             "and top-p (processed_); as log-probabilities or logits "
                             "(default: %(default)s)")
    parser.add_argument("--cpu-threads", type=int, default=None,
                        help="torch threads on the CPU backend (default: "
                             "$CADENCE_CPU_THREADS, else 1 below 100M parameters, else "
                             "every usable core)")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int,
                        default=d.tensor_parallel_size, metavar="N",
                        help="split the model over N GPUs, one worker process each (on "
                             "the CPU: N processes over gloo) (default: %(default)s)")
    # vLLM's, taken at what cadence does (EngineArgs refuses other values in one line).
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1, metavar="N",
                        help="vLLM's: 1 only (split a model with --tensor-parallel-size)")
    parser.add_argument("--distributed-executor-backend", default=None, choices=["mp", "uni"],
                        help="vLLM's: mp (a process per tensor-parallel rank) or uni (one "
                             "process, tensor-parallel size 1) (default: by size)")
    parser.add_argument("--enable-lora", action=argparse.BooleanOptionalAction, default=False,
                        help="vLLM's: off only (cadence serves no adapters)")
    parser.add_argument("--enable-sleep-mode", action=argparse.BooleanOptionalAction,
                        default=False, help="vLLM's: off only (cadence has no sleep mode)")
    parser.add_argument("--limit-mm-per-prompt", type=json_object, default=None, metavar="JSON",
                        help="vLLM's: text only here ('{}' or 0 of each modality)")
    parser.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=False,
                        help="run the engine core in a process of its own rather than a "
                             "thread beside the server's event loop")


def _switch(parser: argparse.ArgumentParser, name: str, default: bool | None, on: str,
            off: str) -> None:
    """vLLM's flag pair ``--NAME`` / ``--no-NAME``, both setting one destination."""
    dest = name.replace("-", "_")
    parser.add_argument(f"--{name}", dest=dest, action="store_true", default=default, help=on)
    parser.add_argument(f"--no-{name}", dest=dest, action="store_false", help=off)
