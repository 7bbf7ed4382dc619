"""Tensor parallelism on the CPU (gloo): two worker processes give the tokens of one, and a
worker that dies takes the engine down without leaving processes behind."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch

from cadence import LLM, SamplingParams
from cadence.engine import AsyncLLM
from cadence.engine.core_proc import EngineDeadError
from cadence.engine.engine_args import EngineArgs
from tests.engine.tp_helpers import build_checkpoint, child_pids

PROMPTS = [
    {"prompt_token_ids": [5, 17, 33, 99, 4]},
    {"prompt_token_ids": list(range(10, 50))},  # prefilled in chunks (16-token budget)
    {"prompt_token_ids": [7] * 9 + [200, 3]},
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, top_k=20, seed=11, max_tokens=10, ignore_eos=True)


def _tokens(llm: LLM) -> list[list[int]]:
    params = [GREEDY, GREEDY, SEEDED]
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def _engine(path, tp: int, **kwargs) -> LLM:
    return LLM(str(path), tensor_parallel_size=tp, skip_tokenizer_init=True, device="cpu",
               max_model_len=128, max_num_seqs=4, max_num_batched_tokens=16, **kwargs)


@pytest.mark.parametrize(
    ("family", "kv_heads", "vocab", "tie", "extra"),
    [
        # Two KV heads split one per rank, async scheduling, the graph path emulated.
        ("llama", 2, 256, False, {"async_scheduling": True, "emulate_graphs": True}),
        # One KV head replicated on both ranks; a vocabulary that does not split evenly (the
        # last rank's rows are padding); tied embeddings; synchronous steps.
        ("qwen3", 1, 255, True, {"async_scheduling": False}),
        # Row-parallel biases (o_proj, down_proj) are added once, by rank 0.
        ("llama-bias", 2, 256, False, {"async_scheduling": True}),
        # Gemma 2 (soft caps, alternating windows, post-norms) and Gemma 3 (q/k norms, local
        # rope), with tied embeddings and one KV head.
        ("gemma2", 2, 256, True, {"async_scheduling": True}),
        ("gemma3", 1, 255, True, {"async_scheduling": False}),
        # Qwen3-MoE: 8 experts, 3 per token, each expert's channels split over the ranks; a
        # dense layer too.
        ("qwen3-moe", 2, 256, False, {"async_scheduling": True}),
        # Phi-3: q/k/v and gate/up fused in the checkpoint, each rank reads its rows of each
        # part; longrope and a sliding window.
        ("phi3", 2, 256, False, {"async_scheduling": True}),
        # Phi-4-mini's partial rotation: each rank permutes its own heads' q/k rows.
        ("phi4-mini", 2, 256, True, {"async_scheduling": False}),
    ],
    ids=["llama-kv2-async-graphs", "qwen3-kv1-vocab255-sync", "llama-bias", "gemma2",
         "gemma3-kv1-vocab255", "qwen3-moe", "phi3", "phi4-mini"],
)
def test_tp2_gives_the_tokens_of_tp1(tmp_path, family, kv_heads, vocab, tie, extra):
    path = build_checkpoint(tmp_path / family, family, kv_heads=kv_heads, vocab=vocab, tie=tie)
    before = child_pids()
    one = _engine(path, 1, **extra)
    expected = _tokens(one)
    one.shutdown()
    assert child_pids() == before  # one rank: no process of its own
    two = _engine(path, 2, **extra)
    try:
        assert len(child_pids()) == len(before) + 2
        assert _tokens(two) == expected
        assert _tokens(two) == expected  # again, over the prefix cache
    finally:
        two.shutdown()
    assert child_pids() == before


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("tp") / "llama", "llama", kv_heads=2,
                            vocab=256, tie=False)


def test_fp8_weights_and_cache_run_split_over_two_ranks(llama):
    """Each rank quantizes its own shard (a row-parallel shard's channel scales are its own, so
    the tokens need not equal one rank's); the FP8 options reach the workers and run."""
    before = child_pids()
    two = _engine(llama, 2, quantization="fp8", kv_cache_dtype="fp8")
    try:
        tokens = _tokens(two)
        assert [len(t) for t in tokens] == [10, 10, 10]
        assert _tokens(two)[:2] == tokens[:2]  # greedy: the same again, over the prefix cache
        assert two.engine_core.config.cache.cache_dtype == "fp8"
        # What benchmarks read of the model: its FP8 projections and the ranks' cache dtype.
        from cadence.bench.common import weight_bytes
        from cadence.model.fp8 import Fp8Linear

        runner = two.engine_core.runner
        assert runner.kv_dtype == torch.float8_e4m3fn
        assert sum(isinstance(m, Fp8Linear) for m in runner.model.modules()) == 4 * 2  # 2 layers
        model = runner.model
        dense = sum(p.numel() * 4 for n, p in model.named_parameters()
                    if "embed_tokens" not in n and p.dtype == torch.float32)
        fp8 = sum(p.numel() for p in model.parameters() if p.dtype == torch.float8_e4m3fn)
        assert fp8 > 0 and weight_bytes(model) == dense + fp8
    finally:
        two.shutdown()
    assert child_pids() == before


def test_a_rank_that_cannot_load_is_a_start_up_error(tmp_path):
    from safetensors.torch import load_file, save_file

    path = build_checkpoint(tmp_path / "m", "llama", kv_heads=2, vocab=256, tie=False)
    weights = load_file(path / "model.safetensors")
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    before = child_pids()
    with pytest.raises(ValueError, match="missing tensor 'model.layers.1.mlp.down_proj.weight'"):
        _engine(path, 2)
    assert child_pids() == before


def test_a_user_mistake_under_tp_is_one_line_from_the_command(tmp_path):
    """A directory without weights under -tp 2: the command's one-line error, no rank's
    traceback or death notice before it."""
    import subprocess
    import sys

    path = build_checkpoint(tmp_path / "m", "llama", kv_heads=2, vocab=256, tie=False)
    (path / "model.safetensors").unlink()
    proc = subprocess.run([sys.executable, "-m", "cadence", "generate", "--model", str(path),
                           "-tp", "2", "--device", "cpu", "--max-tokens", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and " ERROR " not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "cadence generate: error: no safetensors weights")


def test_a_killed_worker_fails_the_next_generate_and_leaves_no_process(llama, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # the workers see the engine's environment
    before = child_pids()
    llm = _engine(llama, 2)
    workers = [p.pid for p in llm.engine_core.runner.procs]
    assert sorted(set(child_pids()) - set(before)) == sorted(workers)
    for pid in workers:
        with open(f"/proc/{pid}/environ", "rb") as f:
            assert b"NCCL_NVLS_ENABLE=0" in f.read().split(b"\0")
    os.kill(workers[1], signal.SIGKILL)
    with pytest.raises(RuntimeError, match="tensor-parallel worker rank"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.shutdown()
    assert child_pids() == before


def test_a_worker_death_ends_an_async_engine_mid_stream_and_when_idle(llama):
    before = child_pids()

    async def stream_then_kill() -> None:
        engine = AsyncLLM(EngineArgs(model=str(llama), tensor_parallel_size=2, device="cpu",
                                     skip_tokenizer_init=True, max_model_len=128,
                                     max_num_seqs=4))
        try:
            params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
            stream = engine.generate({"prompt_token_ids": [3, 4, 5]}, params, "r0")
            rank0 = engine.engine_core.proc.engine_core.runner.procs[0]
            received = 0
            with pytest.raises(EngineDeadError):
                async for _ in stream:
                    received += 1
                    if received == 1:  # the first token is out: rank 0 dies mid-stream
                        os.kill(rank0.pid, signal.SIGKILL)
            assert 1 <= received < 100
            assert engine.errored
        finally:
            engine.shutdown()

    asyncio.run(stream_then_kill())
    assert child_pids() == before

    # Idle: no request is running when rank 1 dies, and the engine thread ends by itself.
    engine = AsyncLLM(EngineArgs(model=str(llama), tensor_parallel_size=2, device="cpu",
                                 skip_tokenizer_init=True, max_model_len=128, max_num_seqs=4))
    try:
        proc = engine.engine_core.proc
        os.kill(proc.engine_core.runner.procs[1].pid, signal.SIGKILL)
        proc.thread.join(60)
        assert not proc.thread.is_alive()
        assert engine.errored
        assert "rank 1" in str(proc.error)
    finally:
        engine.shutdown()
    assert child_pids() == before


def test_structured_outputs_and_ctrl_c_under_tp2() -> None:
    """Grammars under TP=2 (the ranks compile them on their own threads, the engine's compile
    gates the request) give TP=1's valid outputs; a Ctrl-C that reaches the ranks (the terminal
    signals the whole process group) leaves them running: the engine decides when they stop."""
    from cadence.sampling_params import StructuredOutputsParams

    choices = ["red", "green", "blue"]
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=20,
                             structured_outputs=StructuredOutputsParams(choice=choices))
              for i in range(4)]
    results = []
    for tp in (1, 2):
        before = set(child_pids())
        llm = LLM("tiny", tensor_parallel_size=tp, device="cpu", max_model_len=128,
                  max_num_seqs=4)
        try:
            ranks = set(child_pids()) - before
            assert len(ranks) == (2 if tp == 2 else 0)
            for pid in ranks:
                os.kill(pid, signal.SIGINT)
            outs = llm.generate(["Pick a colour:"] * 4, params, use_tqdm=False)
            results.append([o.outputs[0].text for o in outs])
            assert set(child_pids()) - before == ranks  # the ranks outlived the SIGINT
        finally:
            llm.shutdown()
    assert all(text in choices for text in results[1])
    assert results[0] == results[1]
