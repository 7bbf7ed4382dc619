"""vLLM's ``compilation_config``: its CUDA-graph options as cadence's graph settings."""

from __future__ import annotations

import logging

import pytest

from cadence import LLM
from cadence.cli import parse_args
from cadence.compilation_config import GraphChoice, graph_settings, read_compilation_config
from cadence.engine.engine_args import EngineArgs
from cadence.server.cli import engine_args_from


@pytest.mark.parametrize("value, choice", [
    (None, GraphChoice()),
    (3, GraphChoice()),  # a level: cadence compiles nothing
    ({"mode": "VLLM_COMPILE", "level": 0}, GraphChoice()),
    ({"cudagraph_mode": "NONE"}, GraphChoice(enforce_eager=True)),
    ({"cudagraph_mode": "full_decode_only"}, GraphChoice(max_capture_tokens=0)),
    ({"cudagraph_mode": "FULL_AND_PIECEWISE"}, GraphChoice()),
    ({"cudagraph_mode": "PIECEWISE", "max_cudagraph_capture_size": 256},
     GraphChoice(max_capture_tokens=256)),
    ({"cudagraph_capture_sizes": [1, 2, 4, 512, 8]}, GraphChoice(max_capture_tokens=512)),
    ({"cudagraph_capture_sizes": []}, GraphChoice(enforce_eager=True, max_capture_tokens=0)),
    # A capture size of 0 (">= 0"): no mixed-step graphs, decode graphs kept.
    ({"max_cudagraph_capture_size": 0}, GraphChoice(max_capture_tokens=0)),
    # Decode graphs only: the cap of mixed steps is 0 whatever the sizes say.
    ({"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2]},
     GraphChoice(max_capture_tokens=0)),
])
def test_graph_options_map_onto_cadences(value, choice) -> None:
    assert read_compilation_config(value) == choice


@pytest.mark.parametrize("value, fragment", [
    (4, "must be 0-3"),
    (True, "an optimization level"),
    ("3", "an optimization level"),
    ({1: 2}, "field names are strings"),
    ({"level": "fast"}, "compilation_config.level must be"),
    ({"cudagraph_mode": "ALL"}, "cudagraph_mode must be one of"),
    ({"cudagraph_mode": 2}, "cudagraph_mode must be one of"),
    ({"max_cudagraph_capture_size": -1}, "max_cudagraph_capture_size must be"),
    ({"cudagraph_capture_sizes": [4, 0]}, "list of positive integers"),
    ({"cudagraph_capture_sizes": 8}, "list of positive integers"),
    ({"max_cudagraph_capture_size": 8, "cudagraph_capture_sizes": [4]}, "must be the largest"),
    # A typo is refused (vLLM's CompilationConfig forbids unknown fields), not ignored.
    ({"cudagraph_mod": "NONE"},
     r"unknown field 'cudagraph_mod' \(did you mean 'cudagraph_mode'\?\)"),
    ({"graphs": False}, r"unknown field 'graphs'; vLLM's CompilationConfig has no such field"),
])
def test_bad_values_name_the_field(value, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        EngineArgs(compilation_config=value)


def test_compiler_options_are_logged_as_changing_nothing(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="cadence.compilation_config"):
        read_compilation_config({"custom_ops": ["none"], "use_inductor": False,
                                 "pass_config": {}, "full_cuda_graph": True})
    assert "custom_ops, full_cuda_graph, pass_config, use_inductor change nothing" in caplog.text


def test_engine_args_take_them_and_refuse_a_disagreeing_cap() -> None:
    assert graph_settings({"cudagraph_mode": "NONE"}, False, 64) == (True, 64)
    assert graph_settings({"max_cudagraph_capture_size": 64}, False, 64) == (False, 64)
    args = EngineArgs(compilation_config={"cudagraph_mode": "NONE"})
    assert args.enforce_eager and args.max_capture_tokens is None
    with pytest.raises(ValueError, match="max_capture_tokens=16 and compilation_config's "
                                         "capture size 8 disagree"):
        EngineArgs(compilation_config={"max_cudagraph_capture_size": 8}, max_capture_tokens=16)


def test_the_engine_runs_with_them() -> None:
    llm = LLM("tiny", max_model_len=64, compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"})
    try:
        assert llm.engine_core.config.graphs.max_capture_tokens == 0
        assert llm.generate("hi", use_tqdm=False)[0].outputs[0].token_ids
    finally:
        llm.shutdown()
    llm = LLM("tiny", max_model_len=64, compilation_config=0)
    llm.shutdown()


def test_the_flag_and_a_config_file(tmp_path) -> None:
    ns = parse_args(["serve", "--compilation-config", '{"cudagraph_mode": "NONE"}'])
    assert engine_args_from(ns).enforce_eager
    assert engine_args_from(parse_args(["serve", "-O", "3"])).compilation_config == 3
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("compilation_config:\n  max_cudagraph_capture_size: 128\n")
    assert engine_args_from(parse_args(["serve", "--config", str(cfg)])).max_capture_tokens == 128
    with pytest.raises(SystemExit):
        parse_args(["serve", "--compilation-config", "[1]"])
