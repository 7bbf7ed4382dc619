"""`cadence bench ttft`'s rows from given times, on a stand-in engine core holding Llama-3-8B's
shapes (on the meta device): the lengths run, the figures and the floor, worked out by hand."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from cadence.bench import ttft
from cadence.model.attention import TorchAttentionBackend
from cadence.model.decoder import CausalLM
from cadence.model.registry import resolve_model


class _Core:
    """What `bench ttft` reads of an EngineCore (no graphs captured)."""

    made: list = []  # the EngineArgs of each core made

    def __init__(self, args) -> None:
        _Core.made.append(args)
        with torch.device("meta"):
            model = CausalLM(resolve_model(args.model).hf_config,
                             TorchAttentionBackend()).to(torch.bfloat16)
        self.runner = SimpleNamespace(model=model, mixed_graphs=None, capture_seconds=0.0)
        self.config = SimpleNamespace(graphs=SimpleNamespace(max_capture_tokens=0))
        self.vocab_size = 128256
        self.batch_queue_size = 1

    def shutdown(self) -> None:
        pass


@pytest.fixture
def timed(monkeypatch) -> list[str]:
    """The request ids timed, in order; warm-ups take 1 s, timed requests 10, 30 and 20 ms."""
    ids: list[str] = []
    _Core.made.clear()

    def time_one(core, prompt: list[int], request_id: str) -> float:
        ids.append(request_id)
        if request_id.startswith("warm"):
            return 1.0
        return (0.010, 0.030, 0.020)[int(request_id.rsplit("-", 1)[1]) % 3]

    monkeypatch.setattr("cadence.engine.core.EngineCore", _Core)
    monkeypatch.setattr(ttft, "time_one", time_one)
    monkeypatch.setattr(ttft, "device_name", lambda: "NVIDIA H100 80GB HBM3")
    return ids


def _rows(capsys) -> list[dict]:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["figures"]["rows"]


def test_rows_time_only_the_measured_requests_against_the_floor(timed, capsys) -> None:
    """Llama-3-8B reads 15_009_849_344 bytes of weights (test_common's sum) whatever the
    prompt: 5.003283 ms at 3e12 B/s. Its GEMM work for 16 tokens, 2 FLOPs per weight: the
    decoder's 32 * 218_103_808 weights for every token, the head's 128256 * 4096 for the sampled
    row, 2 * (6_979_321_856 * 16 + 525_336_576) = 224.39e9 FLOPs, 0.224 ms at 1e15 FLOP/s: the
    weight read is the floor, a quarter of the 20 ms median."""
    assert ttft.main(["--model", "llama3-8b", "--max-model-len", "64", "--input-lens", "16",
                      "--repeats", "3", "--bandwidth", "3e12", "--flops", "1e15",
                      "--json"]) == 0
    assert timed == ["warm-16-0", "warm-16-1", "t16-0", "t16-1", "t16-2"]
    (row,) = _rows(capsys)
    assert row == {"input_len": 16, "ttft_ms_p50": 20.0, "ttft_ms_min": 10.0,
                   "ttft_ms_max": 30.0, "floor_ms": 5.003, "ratio": 0.25, "graph_bucket": None}


def test_no_floor_without_a_matmul_rate_off_an_h200(timed, capsys) -> None:
    """The measured FLOP rate is the H200's: on an H100 without --flops there is no floor,
    though the bandwidth is given."""
    assert ttft.main(["--model", "llama3-8b", "--max-model-len", "64", "--input-lens", "16",
                      "--repeats", "3", "--bandwidth", "3e12", "--json"]) == 0
    (row,) = _rows(capsys)
    assert "floor_ms" not in row and "ratio" not in row


@pytest.mark.parametrize(("max_model_len", "lengths"), [
    ("2048", [16, 128, 1024]), ("1025", [16, 128, 1024]), ("1024", [16, 128]),
    ("128", [16]), ("10", [9]), ("2", [1])])
def test_default_lengths_leave_room_for_the_token(timed, capsys, max_model_len: str,
                                                  lengths: list[int]) -> None:
    """A prompt of n tokens and its one output token need a context of n + 1: the default
    lengths (16, 128, 1024, 4096) that fit, or the longest prompt that does."""
    assert ttft.main(["--model", "llama3-8b", "--max-model-len", max_model_len, "--repeats",
                      "1", "--json"]) == 0
    assert [r["input_len"] for r in _rows(capsys)] == lengths


def test_a_prompt_past_the_default_budget_runs_in_one_step(timed, capsys) -> None:
    """The step budget is at least the longest prompt (8192 otherwise): a TTFT is one
    prefill step; at most 8 requests run at once."""
    assert ttft.main(["--model", "llama3-8b", "--max-model-len", "16384", "--input-lens",
                      "16,10000", "--repeats", "1", "--json"]) == 0
    assert ttft.main(["--model", "llama3-8b", "--max-model-len", "2048", "--repeats", "1",
                      "--json"]) == 0
    assert [(a.max_num_batched_tokens, a.max_num_seqs) for a in _Core.made] == [
        (10000, 8), (8192, 8)]


def test_gemm_work_of_a_mixture_of_experts_counts_the_experts_each_token_reaches() -> None:
    """Qwen3-30B-A3B, per token and layer: attention 2048*4096 + 2 * 2048*512 + 4096*2048 =
    18_874_368 weights, the router 2048*128 = 262_144 and 8 of 128 experts of 3 * 2048*768
    (603_979_776 / 16); the untied head 151936*2048 runs for the sampled row only."""
    with torch.device("meta"):
        model = CausalLM(resolve_model("qwen3-30b-a3b").hf_config,
                         TorchAttentionBackend()).to(torch.bfloat16)
    per_token = 48 * (18_874_368 + 262_144 + 603_979_776 // 16)
    want = 2 * (per_token * 64 + 151936 * 2048) / 1e12
    assert ttft.matmul_seconds(model, 64, 1e12) == pytest.approx(want, rel=1e-12)
