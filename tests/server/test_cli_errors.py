"""Configuration mistakes end in one line on stderr and exit status 2, never a traceback; the
port is checked before the model loads."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cadence.cli import main

MISTAKES = [
    (["serve", "/nonexistent/model"], "neither a local model directory"),
    (["serve", "tiny", "--max-model-len", "0"], "max_model_len must be at least 1"),
    (["serve", "tiny", "--max-model-len", "-2"], "or -1 (auto"),
    (["serve", "tiny", "--hf-overrides", '{"max_position_embeddings": 0}'],
     "the model's max_position_embeddings must be at least 1, got 0 (from its config.json or "
     "hf_overrides)"),
    (["serve", "tiny", "--max-num-seqs", "0"], "max_num_seqs must be 1 to 65536"),
    (["serve", "tiny", "--max-num-seqs", "3000000"],
     "max_num_seqs must be 1 to 65536, got 3000000"),
    (["serve", "tiny", "--gpu-memory-utilization", "1.5"], "gpu_memory_utilization"),
    (["serve", "qwen3-0.6b"], "load_format='dummy'"),
    (["serve", "tiny", "--port", "99999"], "port must be in"),
    (["serve", "tiny", "--api-server-count", "0"], "api_server_count"),
    (["serve", "tiny", "--chat-template", "{{ broken"], "chat template does not parse"),
    (["serve", "tiny", "--served-model-name", ""], "cannot be empty"),
    (["serve", "tiny", "--max-num-batched-tokens", "0"],
     "max_num_batched_tokens must be 1 to 16777216, got 0"),
    (["generate", "--max-num-batched-tokens", "99999999999999"],  # a traceback from the allocator
     "max_num_batched_tokens must be 1 to 16777216, got 99999999999999"),
    (["generate", "--model", "/nonexistent/model"], "neither a local model directory"),
    (["bench", "latency", "--model", "/nonexistent/model"], "neither a local model directory"),
    # vLLM's other tokenizer modes: the engine's one line, not argparse's usage block.
    (["generate", "--tokenizer-mode", "slow"], "tokenizer_mode='slow' is not supported"),
    (["serve", "tiny", "--tokenizer-mode", "mistral"], "tokenizer_mode='mistral' is not supported"),
    (["serve", "tiny", "--max-log-len", "-1"], "--max-log-len: expected an integer >= 0"),
    (["serve", "tiny", "--pipeline-parallel-size", "2"], "pipeline_parallel_size=2 is not"),
    (["serve", "tiny", "--enable-lora"], "enable_lora=True is not supported"),
    (["serve", "tiny", "--limit-mm-per-prompt", '{"image": 2}'], "multimodal inputs are not"),
    (["serve", "tiny", "--kv-cache-memory-bytes", "0"], "kv_cache_memory_bytes must be at least 1"),
    (["serve", "tiny", "--default-chat-template-kwargs", "[1]"],
     "--default-chat-template-kwargs: expected a JSON object"),
    # Two models (vLLM puts --model in the positional's place: an error there too).
    (["serve", "tiny", "--model", "/nonexistent/model"], "two models given: 'tiny' and --model"),
]


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    if argv[0] == "serve" and "--port" not in argv:
        argv = [*argv, "--port", "0"]  # the default port may be another server's
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(("argv", "message"), MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_configuration_mistakes_are_one_line(argv: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_exit_2(argv, capsys)
    prog = "cadence " + " ".join(argv[:2] if argv[0] == "bench" else argv[:1])
    assert line.startswith(f"{prog}: error: ") and message in line


# A config field's error names the flag the user gave for it; a field the command derived
# (bench latency's max_num_seqs from --batch-sizes, a context from --input-len) names no flag.
NAMED = [
    (["serve", "tiny", "--max-num-seqs", "0"], "--max-num-seqs: max_num_seqs must be"),
    (["serve", "tiny", "--max-num-seqs=0"], "--max-num-seqs: max_num_seqs must be"),
    (["serve", "tiny", "-tp", "0"], "-tp: tensor_parallel_size must be"),
    (["serve", "tiny", "--kv-cache-dtype", "fp9"], "--kv-cache-dtype: kv_cache_dtype='fp9'"),
    (["generate", "--max-model-len", "100000"], "--max-model-len: max_model_len (100000)"),
    (["bench", "throughput", "--model", "tiny", "--max-num-seqs", "0"],
     "--max-num-seqs: max_num_seqs must be"),
    (["trace", "--model", "tiny", "--max-num-batched-tokens", "0"],
     "--max-num-batched-tokens: max_num_batched_tokens must be"),
    # 0 is a value, not "unset": the benchmarks' own defaults are for flags not given.
    (["bench", "ttft", "--model", "tiny", "--max-num-batched-tokens", "0"],
     "--max-num-batched-tokens: max_num_batched_tokens must be"),
    (["generate", "--model", "tiny", "--max-model-len", "0"],
     "--max-model-len: max_model_len must be at least 1"),
]


@pytest.mark.parametrize(("argv", "message"), NAMED, ids=[" ".join(a) for a, _ in NAMED])
def test_a_config_error_names_the_flag_given(argv: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert message in _one_line_exit_2(argv, capsys)


def test_a_derived_value_names_no_flag(capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_exit_2(["bench", "latency", "--model", "tiny", "--batch-sizes", "100000"],
                            capsys)
    assert "--batch-sizes" in line and "--max-num-seqs" not in line, line


def test_a_model_directory_without_config_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "has no config.json" in _one_line_exit_2(["serve", str(tmp_path)], capsys)


@pytest.mark.parametrize("extra", [[], ["--api-server-count", "2"]])
def test_a_taken_port_fails_before_the_model_loads(
    extra: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import cadence.engine.async_llm as async_llm
    import cadence.server.api_servers as api_servers

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the engine started although the port is taken")

    monkeypatch.setattr(async_llm.AsyncLLM, "__init__", never)
    monkeypatch.setattr(api_servers, "start_core_process", never)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        line = _one_line_exit_2(["serve", "tiny", "--port", str(port), *extra], capsys)
    assert f"cannot listen on 127.0.0.1:{port}" in line


@pytest.mark.parametrize("extra", [[], ["--engine-process"]])
def test_the_real_command_prints_no_traceback(extra: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "cadence", "serve", "/nonexistent/model",
                           "--port", "0", *extra], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("cadence serve: error: model ")
    if not extra:  # one line (the engine's arguments are logged once it has started)
        assert len(lines) == 1, lines


def test_an_unknown_option_is_named_by_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["serve", "tiny", "--bogus"], ["generate", "--bogus", "x"]):
        line = _one_line_exit_2(argv, capsys)
        assert line == (f"cadence {argv[0]}: error: unrecognized arguments: "
                        f"{' '.join(argv[argv.index('--bogus'):])} (see cadence {argv[0]} --help)")


BROKEN_FILES = {
    # file of the tiny model's directory -> (what it is replaced with, a fragment of the line)
    "config.json": (b"{bad", "config.json is not a model configuration"),
    "model.safetensors": (b"garbage" * 10, "model.safetensors is not a readable safetensors"),
    "tokenizer.json": (b'{"version": 1, "model": 5}', "the tokenizer in"),
}


@pytest.mark.parametrize("broken", list(BROKEN_FILES))
def test_a_broken_model_file_is_one_line_naming_it(
    broken: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from cadence.model.tiny import ensure_tiny_model

    model = tmp_path / "model"
    shutil.copytree(ensure_tiny_model(), model)
    content, fragment = BROKEN_FILES[broken]
    assert (model / broken).is_file()
    (model / broken).write_bytes(content)
    line = _one_line_exit_2(["generate", "--model", str(model), "--max-tokens", "1"], capsys)
    assert line.startswith("cadence generate: error: ") and fragment in line


@pytest.mark.slow
def test_ctrl_c_while_the_engine_starts_is_one_line(tmp_path) -> None:
    """SIGINT while the model loads: one line and exit status 130, no traceback, no abort (the
    engine thread inside torch once made the interpreter's teardown abort)."""
    import signal

    from tests.server.waiting import spawn_serve, wait_until

    log = tmp_path / "serve.log"
    proc = spawn_serve(
        ["tiny", "--max-model-len", "128", "--num-gpu-blocks-override", "32", "--port", "0"], log
    )
    try:
        # The engine's first log line: it is loading (the arguments are logged once it runs).
        wait_until(lambda: "cadence.engine" in log.read_text(), "the engine to start",
                   timeout=120)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text and "terminate called" not in text, text
    if "Uvicorn running" not in text and "Serving on" not in text:  # still starting: stopped
        assert code == 130 and "cadence serve: interrupted" in text, (code, text)
    else:  # the server had taken the signal over: a graceful stop
        assert code == 0, text
