"""Tensor parallelism on two GPUs (all-reduces inside the CUDA graphs): TP=2 gives the greedy
tokens of TP=1 in float32 on a random checkpoint, through the custom all-reduce for the small
all-reduces (NCCL for the rest), and through NCCL alone when the custom one is disabled."""

from __future__ import annotations

import pytest

from cadence import LLM, SamplingParams
from tests.engine.tp_helpers import build_checkpoint, child_pids

pytestmark = pytest.mark.gpu

PROMPTS = [{"prompt_token_ids": [5, 17, 33, 99, 4]},
           {"prompt_token_ids": list(range(10, 90))},
           {"prompt_token_ids": [7] * 9 + [200, 3]}]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
CUSTOM_ON = "Custom all-reduce on 2 ranks"
CUSTOM_OFF = "Custom all-reduce off: disabled by CADENCE_DISABLE_CUSTOM_ALL_REDUCE"


def _two_gpus() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


def _tp1_and_tp2_tokens(tmp_path, family: str, kv_heads: int, vocab: int,
                        enforce_eager: bool) -> list[list[list[int]]]:
    path = build_checkpoint(tmp_path / family, family, kv_heads=kv_heads, vocab=vocab,
                            tie=family == "qwen3")
    results = []
    before = child_pids()
    for tp in (1, 2):
        llm = LLM(str(path), tensor_parallel_size=tp, dtype="float32", device="cuda",
                  skip_tokenizer_init=True, max_model_len=256, max_num_seqs=8,
                  max_num_batched_tokens=64, enforce_eager=enforce_eager,
                  num_gpu_blocks_override=128)
        try:
            results.append([list(o.outputs[0].token_ids)
                            for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)])
        finally:
            llm.shutdown()
        assert child_pids() == before
    return results


@pytest.mark.skipif(not _two_gpus(), reason="needs two CUDA devices")
@pytest.mark.parametrize(("family", "kv_heads", "vocab"),
                         [("llama", 2, 256), ("qwen3", 1, 255)])
@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "eager"])
def test_tp2_gives_the_tokens_of_tp1_on_gpu(tmp_path, monkeypatch, capfd, family, kv_heads,
                                            vocab, enforce_eager):
    monkeypatch.delenv("CADENCE_DISABLE_CUSTOM_ALL_REDUCE", raising=False)
    monkeypatch.setenv("CADENCE_LOG_LEVEL", "INFO")  # the workers' set-up line is checked below
    results = _tp1_and_tp2_tokens(tmp_path, family, kv_heads, vocab, enforce_eager)
    assert results[0] == results[1]
    err = capfd.readouterr().err
    assert err.count(CUSTOM_ON) == 2, err[-4000:]  # one line per rank


@pytest.mark.skipif(not _two_gpus(), reason="needs two CUDA devices")
def test_tp2_with_nccl_alone_gives_the_tokens_of_tp1_on_gpu(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("CADENCE_DISABLE_CUSTOM_ALL_REDUCE", "1")
    monkeypatch.setenv("CADENCE_LOG_LEVEL", "INFO")
    results = _tp1_and_tp2_tokens(tmp_path, "llama", 2, 256, enforce_eager=False)
    assert results[0] == results[1]
    err = capfd.readouterr().err
    assert CUSTOM_ON not in err and err.count(CUSTOM_OFF) == 2, err[-4000:]
