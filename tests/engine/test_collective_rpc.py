"""vLLM's collective_rpc / apply_model: offline (LLM, LLMEngine), async (the core in a thread and
in a process of its own) and over tensor-parallel ranks, on the CPU."""

from __future__ import annotations

import asyncio

import pytest
import torch

from cadence import LLM, SamplingParams
from cadence.engine import AsyncLLM
from tests.engine.tp_helpers import build_checkpoint
from tests.tiny import tiny_args

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = {"prompt_token_ids": [5, 17, 33, 99, 4]}


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def silence_final_norm(model: torch.nn.Module) -> None:
    """In place (the steps read these tensors): every logit becomes the same."""
    with torch.no_grad():
        model.model.norm.weight.zero_()
        if getattr(model.lm_head, "bias", None) is not None:
            model.lm_head.bias.zero_()


def echo_rank(worker) -> tuple[int, int, bool]:
    """vLLM's test_collective_rpc.py reads the worker's rank."""
    return worker.rank, worker.local_rank, worker.is_driver_worker


def rank_and_heads(worker) -> tuple[int, int]:
    """The rank this worker is, and the q/k/v rows of its first layer (its shard)."""
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    qkv = worker.get_model().model.layers[0].self_attn.qkv_proj.weight
    return rank, qkv.shape[0]


def test_offline_rpc_reads_and_changes_the_model_between_steps() -> None:
    llm = LLM(**vars(tiny_args()))
    try:
        model = llm.collective_rpc("get_model")
        assert len(model) == 1 and isinstance(model[0], torch.nn.Module)
        expected = sum(p.numel() for p in model[0].parameters())
        assert llm.apply_model(parameter_count) == [expected]
        assert llm.llm_engine.collective_rpc(lambda w, k: k * 2, args=(21,)) == [42]
        # vLLM's workers hold their runner: code written for them reaches the same model.
        assert llm.collective_rpc(lambda w: w.model_runner.model is w.get_model()) == [True]
        assert llm.collective_rpc(echo_rank) == [(0, 0, True)]
        before = llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
        assert llm.apply_model(silence_final_norm) == [None]
        after = llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
        # All logits equal: greedy takes the lowest id, every step.
        assert list(after) == [0] * len(after) and list(before) != list(after)
        with pytest.raises(ValueError, match="no method 'no_such_method'"):
            llm.collective_rpc("no_such_method")
        # vLLM's timeout is taken (the call runs in this thread) and checked.
        assert llm.collective_rpc(parameter_count_of_worker, timeout=5) == [expected]
        for bad in (0, -1, "5", True, float("nan")):
            with pytest.raises(ValueError, match="timeout must be"):
                llm.collective_rpc("get_model", timeout=bad)
        # The engine serves on after a refused call.
        assert len(llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 6
    finally:
        llm.shutdown()


@pytest.mark.parametrize("engine_process", [False, True], ids=["thread", "process"])
def test_async_rpc_in_a_thread_and_across_a_process(engine_process: bool) -> None:
    async def main() -> None:
        llm = AsyncLLM(tiny_args(engine_process=engine_process, async_scheduling=True))
        try:
            counts = await llm.collective_rpc(parameter_count_of_worker)
            assert len(counts) == 1 and counts[0] > 0
            assert await llm.collective_rpc(parameter_count_of_worker, timeout=60) == counts
            row = await llm.collective_rpc(head_row, args=(40,))
            doubled = await llm.collective_rpc(head_row, args=(40,), kwargs={"scale": 2.0})
            assert isinstance(row[0], torch.Tensor) and row[0].abs().sum() > 0
            assert torch.equal(doubled[0], 2 * row[0])
            with pytest.raises(Exception, match="two-argument failure"):
                await llm.collective_rpc(raise_two_arg_error)
            with pytest.raises(RuntimeError, match="SystemExit"):
                await llm.collective_rpc(exit_the_process)
            if engine_process:
                with pytest.raises(ValueError, match="must be picklable"):
                    await llm.collective_rpc(lambda w: 0)
                with pytest.raises(ValueError, match="the results must be picklable"):
                    await llm.collective_rpc(unpicklable_result)
                # Any utility whose result cannot cross fails alone (it hung the caller).
                with pytest.raises(RuntimeError, match="cannot be sent to the front end"):
                    await asyncio.wait_for(llm.call_utility("early_aborts"), 60)
            else:
                assert await llm.collective_rpc(lambda w, k: k + 1, args=(1,)) == [2]
            with pytest.raises(ValueError, match="no method"):
                await llm.collective_rpc("absent")
            with pytest.raises(ValueError, match="timeout must be"):
                await llm.collective_rpc("get_model", timeout=0)
            outs = [o async for o in llm.generate(PROMPT, GREEDY, "after")]
            assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 6
        finally:
            llm.shutdown()

    asyncio.run(main())


def parameter_count_of_worker(worker) -> int:
    return parameter_count(worker.get_model())


def unpicklable_result(worker):
    return lambda: 0


def head_row(worker, index: int = 40, scale: float = 1.0) -> torch.Tensor:
    """A tensor result: it comes back by value (across processes, not as a file descriptor)."""
    return worker.get_model().lm_head.weight[index].detach().clone() * scale


class TwoArgError(Exception):
    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"{what}: {detail}")  # pickled args do not rebuild it


def raise_two_arg_error(worker) -> None:
    raise TwoArgError("two-argument failure", "x")


def exit_the_process(worker) -> None:
    raise SystemExit(3)


def test_rpc_reaches_every_tensor_parallel_rank(tmp_path) -> None:
    path = build_checkpoint(tmp_path / "ckpt", "llama", kv_heads=2, vocab=256, tie=False)
    llm = LLM(str(path), tensor_parallel_size=2, skip_tokenizer_init=True, device="cpu",
              max_model_len=128, max_num_seqs=4, max_num_batched_tokens=16)
    try:
        ranks = llm.collective_rpc(rank_and_heads)
        # 4 query heads and 2 KV heads of 16 dims, split in two: (2 + 1 + 1) * 16 rows a rank.
        assert ranks == [(0, 64), (1, 64)]
        assert llm.collective_rpc(echo_rank) == [(0, 0, True), (1, 1, False)]
        # Tensors come back by value; each rank holds its own rows of the vocabulary.
        rows = llm.collective_rpc(head_row, args=(0,))
        assert [r.shape for r in rows] == [(64,), (64,)] and not torch.equal(rows[0], rows[1])
        with pytest.raises(RuntimeError, match="rank 0: TwoArgError: two-argument failure"):
            llm.collective_rpc(raise_two_arg_error)
        with pytest.raises(RuntimeError, match="rank 0: RuntimeError: .*SystemExit"):
            llm.collective_rpc(exit_the_process)
        with pytest.raises(ValueError, match="must be picklable"):
            llm.collective_rpc(lambda w: 0)
        with pytest.raises(RuntimeError, match="rank 0: ValueError: .*no method 'absent'"):
            llm.collective_rpc("absent")
        with pytest.raises(RuntimeError, match="rank 0: .*the results must be picklable"):
            llm.collective_rpc(unpicklable_result)
        # The ranks serve on.
        assert len(llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 6
    finally:
        llm.shutdown()
