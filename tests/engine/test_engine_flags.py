"""vLLM's engine flags: --dtype half/float, --[no-]enable-chunked-prefill,
--[no-]enable-prefix-caching, --tokenizer, --trust-remote-code and --revision."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cadence.cli import main, parse_args
from cadence.engine.engine_args import EngineArgs
from cadence.engine.llm import LLM
from cadence.model.registry import resolve_model
from cadence.model.tiny import ensure_tiny_model
from cadence.sampling_params import SamplingParams

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _engine_args(*argv: str) -> EngineArgs:
    return EngineArgs.from_cli_args(parse_args(["generate", *argv]))


@pytest.mark.parametrize(("given", "dtype"), [("half", "float16"), ("float", "float32"),
                                              ("float16", "float16"), ("auto", "auto")])
def test_dtype_aliases(given: str, dtype: str) -> None:
    args = _engine_args("--dtype", given)
    assert args.dtype == dtype
    assert args.create_engine_config(64).model.dtype == dtype
    assert EngineArgs(dtype=given).dtype == dtype  # LLM(dtype="half") as well


def test_chunked_prefill_flags() -> None:
    assert _engine_args().enable_chunked_prefill is True
    assert _engine_args("--enable-chunked-prefill").enable_chunked_prefill is True
    off = _engine_args("--no-enable-chunked-prefill")
    config = off.create_engine_config(32768)
    assert config.scheduler.enable_chunked_prefill is False
    # A whole prompt must fit one step: the default budget grows to max_model_len (as vLLM).
    assert config.scheduler.max_num_batched_tokens == 32768
    assert _engine_args().create_engine_config(32768).scheduler.max_num_batched_tokens == 16384
    too_small = _engine_args("--no-enable-chunked-prefill", "--max-num-batched-tokens", "1024")
    with pytest.raises(ValueError, match="chunked prefill is off"):
        too_small.create_engine_config(2048)


@pytest.mark.parametrize(("given", "tokens"), [("4096", 4096), ("1k", 1000), ("2K", 2048),
                                               ("25.6k", 25600), ("1m", 10**6)])
def test_token_counts_take_vllms_suffixes(given: str, tokens: int) -> None:
    args = _engine_args("--max-model-len", given, "--max-num-batched-tokens", given)
    assert (args.max_model_len, args.max_num_batched_tokens) == (tokens, tokens)


def test_byte_sizes_take_vllms_t_suffixes() -> None:
    # vLLM's human_readable_int: t and T too (--kv-cache-memory-bytes).
    assert _engine_args("--kv-cache-memory-bytes", "1T").kv_cache_memory_bytes == 1 << 40
    assert _engine_args("--kv-cache-memory-bytes", "2t").kv_cache_memory_bytes == 2 * 10**12


@pytest.mark.parametrize("given", ["auto", "AUTO", " Auto ", "-1"])
def test_max_model_len_auto_is_minus_one(given: str) -> None:
    # vLLM's spelling of "what the KV cache holds, at most the model's context".
    assert _engine_args("--max-model-len", given).max_model_len == -1


@pytest.mark.parametrize("given", ["lots", "1.5k5", "0.0001k", "k", "K", "autoo", "1.5K"])
def test_token_counts_that_are_not_whole_are_usage_errors(given: str) -> None:
    with pytest.raises(SystemExit):
        _engine_args("--max-model-len", given)


def test_long_prefill_token_threshold_flag() -> None:
    assert _engine_args().create_engine_config(64).scheduler.long_prefill_token_threshold == 0
    args = _engine_args("--long-prefill-token-threshold", "24")
    assert args.create_engine_config(64).scheduler.long_prefill_token_threshold == 24
    with pytest.raises(SystemExit):
        _engine_args("--long-prefill-token-threshold", "-1")


def test_stream_interval_flag() -> None:
    assert _engine_args().create_engine_config(64).scheduler.stream_interval == 1
    assert _engine_args("--stream-interval", "4").create_engine_config(64).scheduler \
        .stream_interval == 4
    for bad in ("0", "-2", "x"):
        with pytest.raises(SystemExit):
            _engine_args("--stream-interval", bad)


def test_long_prefill_token_threshold_changes_no_token() -> None:
    """Prompts split at the threshold (3 tokens a step, several prompts sharing each step's
    budget) give the greedy tokens of whole-prompt steps."""
    prompts = ["Hello, my name is", "The capital of France is a city that", "x"]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = []
    for threshold in (0, 3):
        llm = LLM("tiny", long_prefill_token_threshold=threshold, max_num_batched_tokens=8,
                  max_model_len=64, num_gpu_blocks_override=64, enable_prefix_caching=False)
        outs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params,
                                                                  use_tqdm=False)])
        llm.shutdown()
    assert outs[0] == outs[1]


def test_prefix_caching_flags() -> None:
    assert _engine_args().enable_prefix_caching is True
    assert _engine_args("--enable-prefix-caching").enable_prefix_caching is True
    assert _engine_args("--no-enable-prefix-caching").enable_prefix_caching is False
    assert _engine_args("--no-enable-prefix-caching", "--enable-prefix-caching").enable_prefix_caching


def test_trust_remote_code_is_accepted_and_changes_nothing() -> None:
    args = _engine_args("--trust-remote-code")
    assert args.trust_remote_code is True
    plain = _engine_args()
    assert args.create_engine_config(64) == plain.create_engine_config(64)


def test_revision_is_an_error_only_when_given() -> None:
    assert _engine_args().revision is None
    with pytest.raises(ValueError, match="never downloads models"):
        _engine_args("--revision", "main")
    with pytest.raises(ValueError, match="never downloads models"):
        LLM("tiny", revision="main")


def test_quantization_and_kv_cache_dtype_reach_the_configs() -> None:
    assert (_engine_args().quantization, _engine_args().kv_cache_dtype) == (None, "auto")
    cfg = _engine_args("--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3",
                       "--device", "cpu").create_engine_config(64)
    assert (cfg.model.quantization, cfg.cache.cache_dtype) == ("fp8", "fp8")
    cfg = _engine_args("--kv-cache-dtype", "fp8", "--device", "cpu").create_engine_config(64)
    assert (cfg.model.quantization, cfg.cache.cache_dtype) == (None, "fp8")
    assert _engine_args("--kv-cache-dtype", "auto").kv_cache_dtype == "auto"


def test_logprobs_mode_flag_reaches_the_sampler() -> None:
    """vLLM's --logprobs-mode: processed logprobs are of the distribution sampled from; with
    top_k=1 that is one token of probability 1 (log 0), where the raw logprob is below 0."""
    assert _engine_args().logprobs_mode == "raw_logprobs"
    cfg = _engine_args("--logprobs-mode", "processed_logits").create_engine_config(64)
    assert cfg.model.logprobs_mode == "processed_logits"
    with pytest.raises(SystemExit):
        parse_args(["generate", "--logprobs-mode", "bogus"])
    with pytest.raises(ValueError, match="logprobs_mode='bogus' is not supported"):
        EngineArgs(logprobs_mode="bogus")
    params = SamplingParams(temperature=1.0, top_k=1, seed=0, max_tokens=4, logprobs=2,
                            ignore_eos=True)
    got = {}
    for mode in ("raw_logprobs", "processed_logprobs"):
        llm = LLM("tiny", device="cpu", max_model_len=64, logprobs_mode=mode)
        (out,) = llm.generate(["Hello"], params, use_tqdm=False)
        got[mode] = out.outputs[0]
    assert got["raw_logprobs"].token_ids == got["processed_logprobs"].token_ids
    for raw, processed, tid in zip(got["raw_logprobs"].logprobs,
                                   got["processed_logprobs"].logprobs,
                                   got["raw_logprobs"].token_ids, strict=True):
        assert raw[tid].logprob < 0 and processed[tid].logprob == 0.0
        assert processed[tid].rank == 1
        others = [lp.logprob for t, lp in processed.items() if t != tid]
        assert others and all(v == float("-inf") for v in others)


def test_unsupported_quantization_is_a_one_line_error_listing_what_is_supported() -> None:
    with pytest.raises(ValueError, match=r"quantization='awq' is not supported.*supported: fp8"):
        _engine_args("--quantization", "awq")
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp8_e5m2' is not supported.*"
                                         r"supported: auto, fp8, fp8_e4m3"):
        _engine_args("--kv-cache-dtype", "fp8_e5m2")
    with pytest.raises(ValueError, match="quantization='int4'"):
        LLM("tiny", quantization="int4")


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    return ensure_tiny_model()


@pytest.fixture
def tokenizer_only(tmp_path: Path, tiny_dir: Path) -> Path:
    """A directory with the built-in model's tokenizer files and nothing else."""
    out = tmp_path / "tok"
    out.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_dir / name, out / name)
    return out


@pytest.fixture
def weights_only(tmp_path: Path, tiny_dir: Path) -> Path:
    """The built-in model as an HF directory without tokenizer files."""
    out = tmp_path / "weights"
    out.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (out / name).symlink_to(tiny_dir / name)
    return out


def test_tokenizer_resolution(tiny_dir: Path, tokenizer_only: Path, weights_only: Path,
                              tmp_path: Path) -> None:
    assert resolve_model("qwen3-0.6b").tokenizer_path is None
    assert resolve_model("qwen3-0.6b", tokenizer="tiny").tokenizer_path == str(tiny_dir)
    assert resolve_model("qwen3-0.6b", tokenizer=str(tokenizer_only)).tokenizer_path == str(
        tokenizer_only
    )
    assert resolve_model(str(weights_only)).tokenizer_path is None
    assert resolve_model(str(weights_only), tokenizer="tiny").tokenizer_path == str(tiny_dir)
    # Replaces a model directory's own tokenizer.
    assert resolve_model("tiny", tokenizer=str(tokenizer_only)).tokenizer_path == str(
        tokenizer_only
    )
    with pytest.raises(ValueError, match="--tokenizer '/nonexistent/tok' is not a directory"):
        resolve_model("tiny", tokenizer="/nonexistent/tok")
    with pytest.raises(ValueError, match="has no tokenizer files"):
        resolve_model("tiny", tokenizer=str(tmp_path))


def test_tokenizer_gives_a_weight_only_directory_text(weights_only: Path,
                                                      tokenizer_only: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    expected = LLM("tiny", max_model_len=128, num_gpu_blocks_override=32)
    try:
        want = expected.generate(["Once upon a time"], params, use_tqdm=False)[0]
    finally:
        expected.shutdown()
    llm = LLM(str(weights_only), tokenizer=str(tokenizer_only), max_model_len=128,
              num_gpu_blocks_override=32)
    try:
        got = llm.generate(["Once upon a time"], params, use_tqdm=False)[0]
    finally:
        llm.shutdown()
    assert got.prompt_token_ids == want.prompt_token_ids
    assert got.outputs[0].text == want.outputs[0].text and got.outputs[0].text


def test_tokenizer_gives_a_preset_text_prompts(tiny_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--model", "qwen2.5-0.5b", "--load-format", "dummy",
            "--tokenizer", str(tiny_dir), "--max-model-len", "32", "--num-gpu-blocks-override",
            "4", "--cpu-threads", "1", "--prompt", "Hello", "--max-tokens", "2", "--verbose"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    # Text (the dummy weights' ids mostly lie past the tiny vocabulary: often ""), not ids.
    assert len(lines) == 2 and not lines[0].startswith("[")
    assert lines[1] == "[2 tokens, finish_reason=length]"


@pytest.mark.parametrize("seed", [1 << 64, 1 << 70, -(1 << 63) - 1, 1.5, True, "3"])
def test_seeds_torch_cannot_take_are_errors_naming_seed(seed) -> None:
    with pytest.raises(ValueError, match=r"^seed must be an integer"):
        EngineArgs(model="tiny", seed=seed)


def test_seeds_at_the_bounds_are_accepted_and_none_draws_one() -> None:
    for seed in (-(1 << 63), (1 << 64) - 1, 0):
        assert EngineArgs(model="tiny", seed=seed).seed == seed
    drawn = {EngineArgs(model="tiny", seed=None).seed for _ in range(4)}
    assert all(isinstance(s, int) and 0 <= s < 1 << 63 for s in drawn) and len(drawn) > 1


def test_a_kv_cache_past_memory_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    # The built-in model's blocks are 32 KiB: 10**12 of them are ~30 PiB, past any machine.
    argv = ["generate", "--model", "tiny", "--num-gpu-blocks-override", str(10**12),
            "--prompt", "Hello", "--max-tokens", "2"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_gpu_blocks_override=1000000000000 needs" in err[0], err


def test_a_thread_count_torch_cannot_take_is_a_one_line_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--model", "tiny", "--cpu-threads", "100000", "--prompt", "Hello"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cpu_threads must be 1 to 4096, got 100000" in err[0], err


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"enable_prefix_caching": "no"}, "enable_prefix_caching must be True or False"),
    ({"async_scheduling": "false"}, "async_scheduling must be True or False"),
    ({"block_size": 16.5}, "block_size must be an integer"),
    ({"max_model_len": "100"}, "max_model_len must be an integer"),
    ({"tensor_parallel_size": 2.0}, "tensor_parallel_size must be an integer"),
    ({"max_num_seqs": True}, "max_num_seqs must be an integer"),
    ({"gpu_memory_utilization": "0.5"}, "gpu_memory_utilization must be a number"),
    ({"model": 3}, "model must be a string"),
])
def test_engine_args_from_python_are_of_their_types(kwargs, message) -> None:
    # The CLI types its flags; the Python API takes anything (a string "no" used to read as true).
    with pytest.raises(ValueError, match=message):
        EngineArgs(**kwargs)


def test_engine_args_take_numpy_numbers_and_paths(tmp_path: Path) -> None:
    import numpy as np

    args = EngineArgs(model=tmp_path, block_size=np.int64(32), gpu_memory_utilization=1,
                      async_scheduling=None, max_model_len=None)
    assert args.model == str(tmp_path) and type(args.block_size) is int and args.block_size == 32
    assert type(args.gpu_memory_utilization) is float


def test_cpu_threads_out_of_range_are_refused_on_any_device() -> None:
    # Checked when the arguments are made, not only where the CPU backend reads them (a GPU
    # engine used to start and ignore --cpu-threads 100000).
    for bad in (0, 100000):
        with pytest.raises(ValueError, match=f"cpu_threads must be 1 to 4096, got {bad}"):
            EngineArgs(cpu_threads=bad, device="cuda")
    assert EngineArgs(cpu_threads=4096).cpu_threads == 4096


def test_add_cli_args_returns_the_parser_as_vllms_does() -> None:
    # vLLM's examples write `parser = EngineArgs.add_cli_args(parser)`.
    import argparse

    from cadence.engine.engine_args import AsyncEngineArgs

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--model", "tiny", "--max-num-seqs", "3"]))
    assert (args.model, args.max_num_seqs) == ("tiny", 3)
    parser = AsyncEngineArgs.add_cli_args(argparse.ArgumentParser())
    ns = parser.parse_args(["--enable-log-requests", "--max-num-seqs", "5"])
    async_args = AsyncEngineArgs.from_cli_args(ns)
    assert isinstance(async_args, AsyncEngineArgs)
    assert async_args.enable_log_requests is True and async_args.max_num_seqs == 5
    assert AsyncEngineArgs.from_cli_args(parser.parse_args([])).enable_log_requests is False


def test_seed_and_block_override_take_vllms_none() -> None:
    # vLLM's optional values on the command line: "None" is no value (a random seed).
    assert _engine_args("--seed", "7").seed == 7
    assert _engine_args("--num-gpu-blocks-override", "None").num_gpu_blocks_override is None
    first, second = _engine_args("--seed", "None").seed, _engine_args("--seed", "none").seed
    assert isinstance(first, int) and first != second  # each drew its own
    with pytest.raises(SystemExit):
        _engine_args("--seed", "seven")


def test_flags_left_out_give_the_python_apis_defaults() -> None:
    """A command line that sets nothing is EngineArgs() (LLM's defaults), field for field, and
    those are vLLM's where cadence has the setting: one stream of requests in arrival order
    on one GPU, CUDA graphs on, 90% of the GPU's memory, 16-token blocks, up to 20 logprobs,
    raw logprobs, seed 0, asynchronous scheduling left to its own default."""
    import dataclasses

    args, api = _engine_args(), EngineArgs()
    differ = [f.name for f in dataclasses.fields(EngineArgs)
              if getattr(args, f.name) != getattr(api, f.name)]
    assert differ == []
    assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (1, 1)
    assert (args.scheduling_policy, args.enforce_eager, args.async_scheduling) == (
        "fcfs", False, None)
    assert (args.gpu_memory_utilization, args.block_size, args.max_logprobs) == (0.9, 16, 20)
    assert (args.logprobs_mode, args.seed, args.kv_cache_dtype) == ("raw_logprobs", 0, "auto")
    assert (args.device, args.dtype, args.load_format, args.generation_config) == (
        "auto", "auto", "auto", "auto")
    assert (args.skip_tokenizer_init, args.engine_process) == (False, False)


def test_values_vllm_takes_are_taken() -> None:
    args = _engine_args("--distributed-executor-backend", "uni", "--dtype", "bfloat16",
                        "--max-capture-tokens", "0", "--num-gpu-blocks-override", "None",
                        "--load-format", "dummy", "--async-scheduling")
    assert (args.distributed_executor_backend, args.dtype, args.max_capture_tokens) == (
        "uni", "bfloat16", 0)
    assert (args.num_gpu_blocks_override, args.load_format, args.async_scheduling) == (
        None, "dummy", True)
    assert _engine_args("--distributed-executor-backend", "mp").distributed_executor_backend \
        == "mp"
    assert _engine_args("--no-async-scheduling").async_scheduling is False
    assert [_engine_args("--dtype", d).dtype for d in ("float32", "float16", "bfloat16")] == [
        "float32", "float16", "bfloat16"]
