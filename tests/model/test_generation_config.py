"""Default sampling fields from generation_config.json (--generation-config auto|vllm|DIR)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.engine.llm import LLM
from cadence.model.generation_config import generation_defaults
from cadence.model.registry import resolve_model
from cadence.sampling_params import SamplingParams
from tests.tiny import tiny_copy_with_generation_config


def _dir(tmp_path: Path, name: str, config: dict) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "generation_config.json").write_text(json.dumps(config))
    return d


def test_only_fields_that_differ_from_transformers_defaults_count(tmp_path: Path) -> None:
    d = _dir(tmp_path, "g", {"eos_token_id": 2, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
                             "do_sample": True, "repetition_penalty": 1.05})
    assert generation_defaults("auto", str(d)) == {"temperature": 0.6, "top_p": 0.95,
                                                   "top_k": 20, "repetition_penalty": 1.05}
    more = _dir(tmp_path, "more", {"min_p": 0.1, "max_new_tokens": 7, "repetition_penalty": 1.0})
    assert generation_defaults("auto", str(more)) == {"min_p": 0.1, "max_tokens": 7}
    same = _dir(tmp_path, "same", {"temperature": 1.0, "top_p": 1.0, "top_k": 50})
    assert generation_defaults("auto", str(same)) == {}
    assert generation_defaults("vllm", str(d)) == {}
    assert generation_defaults("auto", None) == {}  # presets have no file
    assert generation_defaults("auto", str(tmp_path)) == {}  # no file: nothing
    assert generation_defaults(str(d), None)["top_k"] == 20


@pytest.mark.parametrize(
    ("content", "match"),
    [(None, "no generation_config.json"), ("{not json", "cannot read"), ("[1]", "JSON object"),
     ('{"temperature": "hot"}', "not a number"),
     ('{"max_new_tokens": 0.5}', "positive integer"),
     # Values SamplingParams refuses fail at start-up, not in every request that relies on them.
     ('{"temperature": -1}', "temperature must be non-negative, got -1"),
     ('{"temperature": 1e999}', "temperature must be a finite number, got inf"),
     ('{"repetition_penalty": 0}', "repetition_penalty must be in"),
     ('{"top_k": 5.5}', r"top_k must be 0 \(disable\), or at least 1, got 5.5"),
     ('{"top_k": -2}', r"top_k must be 0 \(disable\), or at least 1, got -2"),
     ('{"top_p": 1.5}', "top_p must be in"),
     ('{"top_p": 0}', "top_p must be in"),
     ('{"min_p": 2}', "min_p must be in")],
)
def test_bad_sources_name_the_problem(tmp_path: Path, content: str | None, match: str) -> None:
    d = tmp_path / "bad"
    d.mkdir()
    if content is not None:
        (d / "generation_config.json").write_text(content)
    with pytest.raises(ValueError, match=match):
        generation_defaults(str(d), None)


@pytest.fixture
def greedy_by_default(tmp_path: Path) -> Path:
    """The tiny model whose generation config makes it greedy unless a request says otherwise."""
    return tiny_copy_with_generation_config(tmp_path / "tiny-greedy", temperature=0.0)


def test_llm_generate_without_params_uses_the_defaults(greedy_by_default: Path) -> None:
    assert resolve_model(str(greedy_by_default)).generation_defaults == {"temperature": 0.0}
    llm = LLM(str(greedy_by_default), max_model_len=128, num_gpu_blocks_override=64)
    try:
        assert llm.get_default_sampling_params().temperature == 0.0
        default = llm.generate(["Once upon a time"], use_tqdm=False)[0].outputs[0].token_ids
        greedy = llm.generate(["Once upon a time"], SamplingParams(temperature=0.0),
                              use_tqdm=False)[0].outputs[0].token_ids
        assert default == greedy
    finally:
        llm.shutdown()
    ignored = LLM(str(greedy_by_default), max_model_len=128, num_gpu_blocks_override=64,
                  generation_config="vllm")
    try:
        assert ignored.get_default_sampling_params().temperature == 1.0
    finally:
        ignored.shutdown()


def test_overrides_lay_over_the_file_as_vllms_merge(tmp_path: Path, caplog) -> None:
    d = _dir(tmp_path, "g", {"temperature": 0.6, "top_p": 0.95, "top_k": 20})
    # Merged under auto or a directory; an override equal to transformers' default still
    # applies (top_p 1.0), None drops the file's value (top_k), max_new_tokens is max_tokens.
    got = generation_defaults("auto", str(d), {"top_p": 1.0, "top_k": None, "min_p": 0.05,
                                               "max_new_tokens": 9})
    assert got == {"temperature": 0.6, "top_p": 1.0, "min_p": 0.05, "max_tokens": 9}
    assert generation_defaults(str(d), None, {"temperature": 0.0})["temperature"] == 0.0
    # Alone under vllm, and for a model without a file.
    assert generation_defaults("vllm", str(d), {"temperature": 0.3}) == {"temperature": 0.3}
    assert generation_defaults("auto", None, {"repetition_penalty": 1.2}) == {
        "repetition_penalty": 1.2}
    assert generation_defaults("auto", str(d), {}) == generation_defaults("auto", str(d))
    # Keys that set no sampling default are logged, not applied.
    with caplog.at_level("WARNING", logger="cadence.model.generation_config"):
        assert generation_defaults("vllm", None, {"do_sample": True}) == {}
    assert "do_sample" in caplog.text


@pytest.mark.parametrize(("override", "match"), [
    ({"temperature": "hot"}, "override_generation_config: temperature is 'hot', not a number"),
    ({"temperature": True}, "not a number"),
    ({"max_new_tokens": 0}, "max_new_tokens is 0, not a positive integer"),
    ({"max_new_tokens": 7.5}, "max_new_tokens is 7.5, not a positive integer"),
    ({"top_p": 1.5}, "override_generation_config: top_p must be in"),
    ('{"temperature": 0.5}', "must be a dict"),
])
def test_bad_overrides_name_the_problem(override, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        generation_defaults("vllm", None, override)



def test_a_files_bad_max_new_tokens_is_refused_naming_the_file(tmp_path: Path) -> None:
    """Checked as the file is read (an override may replace the value later): 0 is refused
    with the file named, even where an override sets max_new_tokens."""
    d = _dir(tmp_path, "g", {"max_new_tokens": 0})
    for override in (None, {"max_new_tokens": 5}):
        with pytest.raises(ValueError, match=r"generation_config\.json sets max_new_tokens to 0"):
            generation_defaults("auto", str(d), override)


def test_a_directory_source_may_start_at_the_home_directory(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    _dir(tmp_path, "configs", {"top_k": 20})
    assert generation_defaults("~/configs", None) == {"top_k": 20}


def test_llm_and_the_cli_take_the_override() -> None:
    from cadence.cli import parse_args
    from cadence.engine.engine_args import EngineArgs

    llm = LLM("tiny", max_model_len=128, num_gpu_blocks_override=64,
              override_generation_config={"temperature": 0.0, "max_new_tokens": 5})
    try:
        params = llm.get_default_sampling_params()
        assert (params.temperature, params.max_tokens) == (0.0, 5)
        out = llm.generate(["Once upon a time"], use_tqdm=False)[0].outputs[0]
        greedy = llm.generate(["Once upon a time"], SamplingParams(temperature=0.0, max_tokens=5),
                              use_tqdm=False)[0].outputs[0]
        assert out.token_ids == greedy.token_ids and len(out.token_ids) <= 5
    finally:
        llm.shutdown()
    ns = parse_args(["generate", "--override-generation-config", '{"temperature": 0.25}'])
    assert EngineArgs.from_cli_args(ns).override_generation_config == {"temperature": 0.25}


def test_fields_that_are_not_applied_are_logged(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    d = _dir(tmp_path, "g", {"eos_token_id": 2, "bos_token_id": 1, "temperature": 0.3,
                             "do_sample": True, "num_beams": 3, "typical_p": 0.5,
                             "transformers_version": "5.0"})
    with caplog.at_level("INFO", logger="cadence.model.generation_config"):
        assert generation_defaults("auto", str(d)) == {"temperature": 0.3}
    (line,) = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    assert "do_sample, num_beams, typical_p not applied" in line
    assert "eos_token_id" not in line and "transformers_version" not in line
