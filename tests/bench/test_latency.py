"""`cadence bench latency`'s figures from given step times, on a stand-in engine core holding a
published model's shapes (on the meta device): each figure worked out by hand."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from cadence.bench import latency
from cadence.config import MAX_NUM_SEQS
from cadence.model.attention import TorchAttentionBackend
from cadence.model.decoder import CausalLM
from cadence.model.registry import resolve_model


class _Core:
    """What `bench latency` reads of an EngineCore; the steps are the fake run_batch's."""

    def __init__(self, args) -> None:
        with torch.device("meta"):
            model = CausalLM(resolve_model(args.model).hf_config,
                             TorchAttentionBackend()).to(torch.bfloat16)
        self.runner = SimpleNamespace(model=model, kv_dtype=torch.bfloat16)
        self.dtype = torch.bfloat16
        self.batch_queue_size = 1

    def shutdown(self) -> None:
        pass


def test_rows_are_the_step_times_against_the_bytes_a_step_reads(monkeypatch, capsys) -> None:
    """Qwen3-30B-A3B, bf16, tensor parallel 2 at 3e12 B/s, 100-token prompts and 50 outputs;
    every timed step takes 10 ms, 4 ms of it waiting for the GPU, three of them a round.
    A step of b requests reads (test_common's sums):
      the dense weights 2 * (48 * (18_874_368 + 266_496) + 151936 * 2048 + 2048),
      the experts some request reaches 2 * 48 * 603_979_776 * (1 - (120/128) ** b),
      b KV caches of the average context 100 + 50 / 2 = 125 tokens, at
      2 * 48 layers * 4 KV heads * 128 * 2 bytes = 98_304 bytes a token."""
    monkeypatch.setattr("cadence.engine.core.EngineCore", _Core)
    calls: list[tuple[int, int, int]] = []

    def run_batch(core, batch: int, input_len: int, output_len: int, seed: int):
        calls.append((batch, output_len, seed))
        return [(0.010, 0.004)] * 3

    monkeypatch.setattr(latency, "run_batch", run_batch)
    assert latency.main(["--model", "qwen3-30b-a3b", "--max-model-len", "256",
                         "--tensor-parallel-size", "2", "--batch-sizes", "1,4",
                         "--input-len", "100", "--output-len", "50", "--repeats", "2",
                         "--bandwidth", "3e12", "--json"]) == 0
    # A warm-up round of at most 8 tokens, then the repeats.
    assert calls == [(1, 8, 99), (1, 50, 0), (1, 50, 1), (4, 8, 99), (4, 50, 0), (4, 50, 1)]
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["figures"]["results"]
    dense = 2 * (48 * (18_874_368 + 266_496) + 151936 * 2048 + 2048)
    for row, batch in zip(rows, (1, 4), strict=True):
        experts = 2 * 48 * 603_979_776 * (1 - (120 / 128) ** batch)
        nbytes = dense + experts + batch * 125 * 98_304
        assert row["batch"] == batch
        assert row["decode_ms_per_step"] == 10.0
        assert row["tokens_per_s"] == 100.0 * batch
        assert abs(row["bytes_per_step"] - nbytes) <= 2
        assert row["achieved_read_GBps"] == pytest.approx(nbytes / 0.010 / 1e9, abs=0.06)
        roofline_s = nbytes / 2 / 3e12  # each GPU reads half at its own bandwidth
        assert row["roofline_ms"] == pytest.approx(roofline_s * 1e3, abs=1e-4)
        assert row["ratio_to_roofline"] == pytest.approx(roofline_s / 0.010, abs=1e-4)
        assert row["ratio_to_roofline"] < 1
        assert row["host_busy_ms_per_step"] == 6.0
        assert row["steps_measured"] == 6


def test_a_batch_of_max_num_seqs_requests_is_taken(capsys) -> None:
    """The largest batch one step runs, and --max-num-seqs equal to the largest batch, pass
    the batch checks (the context check that follows refuses this command line instead)."""
    for extra in ([], ["--max-num-seqs", str(MAX_NUM_SEQS)]):
        with pytest.raises(SystemExit) as info:
            latency.main(["--model", "tiny", "--batch-sizes", f"1,{MAX_NUM_SEQS}",
                          "--input-len", "8", "--output-len", "8", "--max-model-len", "8",
                          *extra])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "--max-model-len 8 is below --input-len + --output-len (16)" in err
    with pytest.raises(SystemExit) as info:
        latency.main(["--model", "tiny", "--batch-sizes", str(MAX_NUM_SEQS + 1)])
    assert info.value.code == 2
    assert f"at most {MAX_NUM_SEQS} requests run in one step" in capsys.readouterr().err
