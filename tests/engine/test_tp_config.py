"""A tensor-parallel size that cannot work is refused in one line, before any process starts."""

from __future__ import annotations

import pytest

from cadence import LLM
from cadence.cli import main
from cadence.engine.engine_args import EngineArgs
from tests.engine.tp_helpers import child_pids


def test_more_ranks_than_visible_gpus(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 needs that many GPUs, but 1 is"):
        EngineArgs(device="cuda", tensor_parallel_size=2).resolve_device()
    assert EngineArgs(device="cuda", tensor_parallel_size=1).resolve_device() == "cuda"


def test_bad_sizes_are_value_errors():
    with pytest.raises(ValueError, match="tensor_parallel_size must be at least 1"):
        EngineArgs(tensor_parallel_size=0)
    before = child_pids()
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\)"):
        LLM("tiny", tensor_parallel_size=3, device="cpu")
    assert child_pids() == before


def test_the_cli_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["generate", "--model", "tiny", "--device", "cpu", "-tp", "3"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cadence generate: error: -tp: tensor_parallel_size=3")
    assert "\n" not in err


def test_an_error_that_cannot_be_rebuilt_goes_back_as_its_text() -> None:
    from cadence.worker.tp_worker import _picklable

    class Odd(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"odd {a} {b}")

    sent = _picklable(Odd(1, 2))
    assert type(sent) is RuntimeError and "Odd: odd 1 2" in str(sent)
    plain = ValueError("fine")
    assert _picklable(plain) is plain
