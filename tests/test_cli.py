"""`cadence generate`: its sampling flags over the generation config's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence.cli import main
from tests.tiny import tiny_copy_with_generation_config


def _token_counts(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[")]


@pytest.fixture(scope="module")
def capped_model(tmp_path_factory) -> Path:
    # The built-in model whose generation config caps a completion at 3 tokens.
    return tiny_copy_with_generation_config(tmp_path_factory.mktemp("gen") / "m",
                                            max_new_tokens=3)


def test_generate_takes_the_generation_configs_defaults(capped_model: Path, capsys) -> None:
    argv = ["generate", "--model", str(capped_model), "--device", "cpu", "-v",
            "--prompt", "Hello", "--prompt", "The cat"]
    assert main(argv) == 0
    assert _token_counts(capsys) == ["[3 tokens, finish_reason=length]"] * 2
    # A flag given wins over the file.
    assert main([*argv, "--max-tokens", "5"]) == 0
    assert _token_counts(capsys) == ["[5 tokens, finish_reason=length]"] * 2
    # --generation-config vllm: no file, the command's own default (32 tokens, or an EOS).
    assert main([*argv, "--generation-config", "vllm"]) == 0
    assert all(ln != "[3 tokens, finish_reason=length]" for ln in _token_counts(capsys))


def test_generate_samples_as_the_generation_config_says(tmp_path: Path, monkeypatch) -> None:
    from cadence.engine.llm import LLM

    model = tiny_copy_with_generation_config(tmp_path / "m", temperature=0.7, top_k=5,
                                             top_p=0.9)
    seen = []
    real = LLM.generate

    def record(self, prompts, params=None, **kw):
        seen.append(params)
        return real(self, prompts, params, **kw)

    monkeypatch.setattr(LLM, "generate", record)
    argv = ["generate", "--model", str(model), "--device", "cpu", "--sampling-seed", "1"]
    assert main([*argv, "--max-tokens", "2"]) == 0
    assert main([*argv, "--max-tokens", "2", "--temperature", "0", "--top-k", "-1"]) == 0
    first, second = seen
    assert (first.temperature, first.top_k, first.top_p, first.max_tokens, first.seed) == (
        0.7, 5, 0.9, 2, 1)
    # Greedy: the file's top_p stays but greedy sampling resets it (as vLLM's does).
    assert (second.temperature, second.top_k, second.max_tokens) == (0.0, 0, 2)


def test_generate_is_greedy_without_sampling_defaults(capped_model: Path, capsys) -> None:
    # The built-in model's file sets no sampling field: greedy, so two runs agree, and equal
    # an explicit --temperature 0 run.
    argv = ["generate", "--model", "tiny", "--device", "cpu", "--max-tokens", "6",
            "--prompt", "Hello"]
    outs = []
    for extra in ([], [], ["--temperature", "0"]):
        assert main([*argv, *extra]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] == outs[2]


def test_generate_refuses_a_bad_flag_before_loading(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--model", "/nonexistent/model", "--temperature", "-1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "temperature" in err and "nonexistent" not in err


def test_help_with_a_keyword_lists_the_options_holding_it(capsys) -> None:
    """vLLM's --help=KEYWORD: the help of the options whose name holds it; all: everything;
    a keyword no option holds is a one-line error."""
    import pytest

    with pytest.raises(SystemExit) as info:
        main(["serve", "--help=max_model_len"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "--max-model-len" in out and "--port" not in out
    with pytest.raises(SystemExit) as info:
        main(["serve", "tiny", "--help=all"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "--max-model-len" in out and "--port" in out
    with pytest.raises(SystemExit) as info:  # a benchmark's own flags, past the dispatcher
        main(["bench", "latency", "--help=max-model"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "--max-model-len" in out and "--batch-sizes" not in out
    with pytest.raises(SystemExit) as info:
        main(["generate", "--help=nothing-like-this"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and "'nothing-like-this'" in err[0]
