"""Tensor parallelism on two GPUs (NCCL, all-reduces inside the CUDA graphs): TP=2 gives the
greedy tokens of TP=1 in float32 on a random checkpoint."""

from __future__ import annotations

import pytest

from cadence import LLM, SamplingParams
from tests.engine.tp_helpers import build_checkpoint, child_pids

pytestmark = pytest.mark.gpu

PROMPTS = [{"prompt_token_ids": [5, 17, 33, 99, 4]},
           {"prompt_token_ids": list(range(10, 90))},
           {"prompt_token_ids": [7] * 9 + [200, 3]}]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _two_gpus() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.mark.skipif(not _two_gpus(), reason="needs two CUDA devices")
@pytest.mark.parametrize(("family", "kv_heads", "vocab"),
                         [("llama", 2, 256), ("qwen3", 1, 255)])
@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "eager"])
def test_tp2_gives_the_tokens_of_tp1_on_gpu(tmp_path, family, kv_heads, vocab, enforce_eager):
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
    assert results[0] == results[1]
