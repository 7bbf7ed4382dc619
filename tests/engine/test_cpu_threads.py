"""CPU thread defaults: one thread for small models, every usable core for large ones, and an
explicit setting (argument or CADENCE_CPU_THREADS) always wins."""

from __future__ import annotations

import os

import pytest
import torch

from cadence.engine.core import EngineCore
from cadence.engine.engine_args import MAX_CPU_THREADS, SMALL_CPU_MODEL_PARAMS, EngineArgs
from cadence.model.dtypes import approx_num_params
from cadence.model.registry import resolve_model
from tests.tiny import tiny_args

CORES = len(os.sched_getaffinity(0))


def test_thread_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CADENCE_CPU_THREADS", raising=False)
    args = EngineArgs()
    assert args.resolve_cpu_threads(SMALL_CPU_MODEL_PARAMS - 1) == 1
    assert args.resolve_cpu_threads(SMALL_CPU_MODEL_PARAMS) == CORES
    assert EngineArgs(cpu_threads=3).resolve_cpu_threads(10**10) == 3
    monkeypatch.setenv("CADENCE_CPU_THREADS", "5")
    assert args.resolve_cpu_threads(1) == 5
    assert EngineArgs(cpu_threads=2).resolve_cpu_threads(1) == 2  # the argument wins
    with pytest.raises(ValueError, match="cpu_threads"):
        EngineArgs(cpu_threads=0).resolve_cpu_threads(1)
    assert EngineArgs(cpu_threads=MAX_CPU_THREADS).resolve_cpu_threads(1) == MAX_CPU_THREADS
    with pytest.raises(ValueError, match="cpu_threads must be 1 to"):  # torch would crash
        EngineArgs(cpu_threads=MAX_CPU_THREADS + 1).resolve_cpu_threads(1)
    monkeypatch.setenv("CADENCE_CPU_THREADS", "100000")  # the message names the variable
    with pytest.raises(ValueError, match="^CADENCE_CPU_THREADS must be 1 to 4096, got 100000"):
        args.resolve_cpu_threads(1)
    monkeypatch.setenv("CADENCE_CPU_THREADS", "0")
    with pytest.raises(ValueError, match="^CADENCE_CPU_THREADS must be 1 to"):
        args.resolve_cpu_threads(1)
    monkeypatch.setenv("CADENCE_CPU_THREADS", "5")
    monkeypatch.setenv("CADENCE_CPU_THREADS", "many")
    with pytest.raises(ValueError, match="CADENCE_CPU_THREADS"):
        args.resolve_cpu_threads(1)


def test_model_sizes() -> None:
    # Qwen3-0.6B: 28 layers x (4 x 1024^2 + 3 x 1024 x 3072) + 151936 x 1024 = 537.3M
    assert approx_num_params(resolve_model("qwen3-0.6b").hf_config) == 537_264_128
    assert approx_num_params(resolve_model("tiny").hf_config) < SMALL_CPU_MODEL_PARAMS


def test_the_cpu_engine_sets_its_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CADENCE_CPU_THREADS", raising=False)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        EngineCore(tiny_args(device="cpu")).shutdown()
        assert torch.get_num_threads() == 1  # the tiny model: one thread
        EngineCore(tiny_args(device="cpu", cpu_threads=2)).shutdown()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


def test_a_bad_cpu_threads_variable_is_one_line_only_where_it_matters(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cadence.cli import main
    from cadence.envs import read_envs

    monkeypatch.setenv("CADENCE_CPU_THREADS", "abc")
    assert read_envs().log_level  # every command reads the environment: that must not fail
    with pytest.raises(SystemExit) as info:
        main(["generate", "--max-tokens", "2", "--device", "cpu"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["cadence generate: error: CADENCE_CPU_THREADS must be an integer, got 'abc'."]
