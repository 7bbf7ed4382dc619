"""Benchmark flags: a value that leaves nothing to time is a usage error naming the flag."""

from __future__ import annotations

import math

import pytest

from cadence.bench import latency, scheduler, serve, throughput, ttft
from cadence.bench.common import median


@pytest.mark.parametrize(("module", "argv", "flag"), [
    (latency, ["--output-len", "2"], "--output-len"),
    (latency, ["--output-len", "1"], "--output-len"),
    (latency, ["--repeats", "0"], "--repeats"),
    (latency, ["--input-len", "0"], "--input-len"),
    (latency, ["--batch-sizes", "1,abc"], "--batch-sizes"),
    (latency, ["--batch-sizes", "0"], "--batch-sizes"),
    (scheduler, ["--steps", "0"], "--steps"),
    (scheduler, ["--repeats", "0"], "--repeats"),
    (scheduler, ["--prompt-len", "0"], "--prompt-len"),
    (ttft, ["--repeats", "0"], "--repeats"),
    (ttft, ["--flops", "0"], "--flops"),
    (ttft, ["--flops", "nan"], "--flops"),
    (latency, ["--bandwidth", "0"], "--bandwidth"),
    (latency, ["--bandwidth", "-5"], "--bandwidth"),
    (scheduler, ["--block-size", "0"], "--block-size"),
    (scheduler, ["--warmup", "-1"], "--warmup"),
    (scheduler, ["--num-requests", "0"], "--num-requests"),
    (serve, ["--num-prompts", "0"], "--num-prompts"),
    (serve, ["--input-len", "0"], "--input-len"),
    (serve, ["--output-len", "0"], "--output-len"),
    (serve, ["--warmup", "-1"], "--warmup"),
    (serve, ["--timeout", "0"], "--timeout"),
    (serve, ["--timeout", "nan"], "--timeout"),
    (serve, ["--concurrency", "0"], "--concurrency"),
    (serve, ["--concurrency", "-1"], "--concurrency"),
    (serve, ["--concurrency", "8,abc"], "--concurrency"),
    (serve, ["--concurrency", ","], "--concurrency"),
    (throughput, ["--num-prompts", "0"], "--num-prompts"),
    (throughput, ["--num-prompts", "-1"], "--num-prompts"),
    (throughput, ["--input-len", "0"], "--input-len"),
    (throughput, ["--output-len", "0"], "--output-len"),
    (ttft, ["--input-lens", "0"], "--input-lens"),
    (ttft, ["--input-lens", "-5"], "--input-lens"),
    (ttft, ["--input-lens", "8,x"], "--input-lens"),
    (ttft, ["--input-lens", "8,"], "--input-lens"),
])
def test_values_that_time_nothing_are_usage_errors(module, argv, flag, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        module.main(["--model", "tiny", *argv])
    assert info.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_a_workload_too_large_to_build_is_refused_before_the_run(capsys) -> None:
    """10^9 prompts were built as a list before anything was said (a MemoryError traceback
    after the model loaded)."""
    with pytest.raises(SystemExit) as info:
        throughput.main(["--model", "tiny", "--num-prompts", "1000000000"])
    assert info.value.code == 2
    assert "--num-prompts 1000000000 x --input-len" in capsys.readouterr().err
    assert serve.main(["--num-prompts", "1000000000", "--base-url", "http://127.0.0.1:9"]) == 2
    assert "more than 100,000,000 prompt tokens" in capsys.readouterr().err


def test_bench_ttft_with_no_room_for_a_prompt_says_so(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        ttft.main(["--model", "tiny", "--max-model-len", "1"])
    assert info.value.code == 2
    assert "--max-model-len 1 leaves no room for a prompt" in capsys.readouterr().err


def test_a_context_too_short_for_the_timed_requests_is_named(capsys) -> None:
    """bench latency with --max-model-len below --input-len + --output-len: a usage error
    naming the flags (the engine's refusal spoke of the KV cache instead)."""
    with pytest.raises(SystemExit) as info:
        latency.main(["--model", "tiny", "--batch-sizes", "1", "--input-len", "64",
                      "--output-len", "8", "--max-model-len", "32"])
    assert info.value.code == 2
    assert "--max-model-len 32 is below --input-len + --output-len (72)" in capsys.readouterr().err


@pytest.mark.parametrize("module", [latency, throughput, ttft, scheduler, serve])
@pytest.mark.parametrize("where", ["a directory", "no folder"])
def test_an_output_file_that_cannot_be_written_is_refused_before_the_run(
    module, where, tmp_path, capsys
) -> None:
    """--json-out (and serve's --plot) is checked with the arguments: it was opened only after
    the whole run, which then ended in a traceback or exit 2 with its figures lost."""
    folder = tmp_path / "taken.png"  # a plot's name, as matplotlib would write it
    folder.mkdir()
    path = str(folder) if where == "a directory" else str(tmp_path / "missing" / "out.json")
    flags = ["--json-out"] + (["--plot"] if module is serve else [])
    for flag in flags:
        with pytest.raises(SystemExit) as info:
            module.main(["--model", "tiny", flag, path])
        assert info.value.code == 2
        assert f"argument {flag}" in capsys.readouterr().err


def test_output_files_that_exist_or_get_a_suffix_are_taken(tmp_path) -> None:
    """An existing writable file is taken whatever its folder (/dev/null, /dev/stdout for a
    user who cannot write in /dev), and a plot's name without a suffix is checked as the
    NAME.png matplotlib writes (a folder NAME beside it is no obstacle)."""
    import argparse
    import os

    from cadence.bench.report import output_file, plot_file

    assert output_file(os.devnull) == os.devnull
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "out.json").write_text("{}")
    locked.chmod(0o555)
    try:
        assert output_file(str(locked / "out.json")) == str(locked / "out.json")
    finally:
        locked.chmod(0o755)
    (tmp_path / "results").mkdir()
    assert plot_file(str(tmp_path / "results")) == str(tmp_path / "results")
    (tmp_path / "taken.png").mkdir()
    with pytest.raises(argparse.ArgumentTypeError, match="is a directory"):
        plot_file(str(tmp_path / "taken"))
    # A suffix matplotlib cannot write is refused with the arguments, not after the run.
    with pytest.raises(argparse.ArgumentTypeError, match="cannot plot to '.xyz' files"):
        plot_file(str(tmp_path / "p.xyz"))
    assert plot_file(str(tmp_path / "p.SVG")) == str(tmp_path / "p.SVG")


@pytest.mark.parametrize(("spec", "message"), [
    (",", "no rate"), ("", "no rate"), ("abc", "'abc' is not a number"), ("0", "at least"),
    ("5,-1", "at least"), ("nan", "at least"), ("1e-320", "at least"), ("1e-300", "at least")])
def test_request_rates_that_are_no_rates_are_errors_naming_the_option(spec, message) -> None:
    from cadence.bench.serve import parse_rates

    with pytest.raises(ValueError, match=f"--request-rate: .*{message}"):
        parse_rates(spec)
    assert parse_rates("inf, 2.5") == [math.inf, 2.5]


def test_median_takes_any_iterable() -> None:
    assert median(x for x in (3.0, 1.0, 2.0)) == 2.0
    assert math.isnan(median(x for x in ()))
    assert math.isnan(median([]))


def test_latency_help_names_the_max_num_seqs_default() -> None:
    help_text = " ".join(latency._parser().format_help().split())
    assert "(default: the largest batch size)" in help_text
    assert "(default: None)" not in help_text


def test_a_burstiness_past_what_the_gamma_draws_take_is_refused() -> None:
    """A huge shape never returns from random.gammavariate: refused with the arguments."""
    import argparse

    from cadence.bench.serve import arrival_offsets, bounded_burstiness

    with pytest.raises(argparse.ArgumentTypeError, match="at most"):
        bounded_burstiness("1e308")
    assert bounded_burstiness("1e6") == 1e6
    offsets = arrival_offsets(3, 1.0, 0, 1e6)  # the largest: returns, nearly evenly spaced
    assert offsets == sorted(offsets) and abs(offsets[1] - 1.0) < 0.05


def test_ttft_defaults_run_the_lengths_the_models_context_holds(capsys) -> None:
    """The tiny model's context is 2,048 tokens: the default lengths past it are left out; one
    asked for by name is a usage error naming --input-lens."""
    import json

    assert ttft.main(["--model", "tiny", "--repeats", "1", "--json", "--no-progress"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["figures"]["rows"]
    assert [r["input_len"] for r in rows] == [16, 128, 1024]
    with pytest.raises(SystemExit) as info:
        ttft.main(["--model", "tiny", "--input-lens", "2048"])
    assert info.value.code == 2
    assert "--input-lens" in capsys.readouterr().err


def test_benchmarks_take_max_model_len_auto(capsys) -> None:
    """--max-model-len auto is left to the engine (a context of what the cache holds), not
    compared with the timed requests' lengths as a number."""
    import json

    assert ttft.main(["--model", "tiny", "--max-model-len", "auto", "--input-lens", "16",
                      "--num-gpu-blocks-override", "8", "--repeats", "1", "--json",
                      "--no-progress"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["figures"]["rows"]
    assert [r["input_len"] for r in rows] == [16]


def test_throughput_refuses_a_context_that_would_cut_the_outputs(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        throughput.main(["--model", "tiny", "--num-prompts", "2", "--input-len", "16",
                         "--output-len", "16", "--max-model-len", "20"])
    assert info.value.code == 2
    assert "--max-model-len 20 is below --input-len + --output-len (32)" in (
        capsys.readouterr().err)


def test_throughput_warms_up_on_prompts_it_does_not_time(monkeypatch, capsys) -> None:
    from cadence.engine.llm import LLM

    seen: list[list[tuple[int, ...]]] = []
    generate = LLM.generate

    def recording(self, prompts, *args, **kwargs):
        seen.append([tuple(p["prompt_token_ids"]) for p in prompts])
        return generate(self, prompts, *args, **kwargs)

    monkeypatch.setattr(LLM, "generate", recording)
    assert throughput.main(["--model", "tiny", "--num-prompts", "6", "--input-len", "32",
                            "--output-len", "2", "--json"]) == 0
    warm, timed = seen
    assert len(timed) == 6 and not set(warm) & set(timed)


def test_scheduler_json_prints_the_record_alone(capsys) -> None:
    import json

    assert scheduler.main(["--repeats", "1", "--steps", "5", "--warmup", "1", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["bench"] == "scheduler"


def test_serve_sends_every_level_and_warm_up_prompts_of_its_own(monkeypatch, tmp_path) -> None:
    """No measured request may find its prompt in the server's prefix cache: every rate,
    every concurrency level and every warm-up has its own prompts; the saved arguments hold
    no API key."""
    import json

    sent: list[list[tuple]] = []

    def fake_level(args, concurrency, prompts, request_rate=math.inf):
        sent.append([tuple(p) for p in prompts])
        return serve.summarize([], 1.0, concurrency, request_rate)

    monkeypatch.setattr(serve, "run_level", fake_level)
    out = tmp_path / "r.json"
    code = serve.main(["--model", "m", "--request-rate", "5,10", "--concurrency", "2,2",
                       "--num-prompts", "3", "--input-len", "8", "--warmup", "2",
                       "--api-key", "topsecret", "--json-out", str(out), "--json"])
    assert code == 0 and len(sent) == 8  # 2 rates x 2 levels, each warm-up and measured
    prompts = [p for batch in sent for p in batch]
    assert len(set(prompts)) == len(prompts)
    saved = out.read_text()
    assert "topsecret" not in saved and json.loads(saved)["args"]["api_key"] == "<set>"


def test_benchmarks_read_a_config_file_as_serve_does(tmp_path, capsys) -> None:
    import json

    # vLLM's --config: long option names (dashes or underscores) to values; the command line
    # wins over the file.
    config = tmp_path / "bench.yaml"
    config.write_text("model: tiny\nbatch_sizes: 3\ninput-len: 8\noutput-len: 5\nrepeats: 1\n")
    assert latency.main(["--config", str(config), "--output-len", "4", "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["model"] == "tiny"
    assert [r["batch"] for r in record["figures"]["results"]] == [3]
    assert record["figures"]["input_len"] == 8 and record["figures"]["output_len"] == 4

    config.write_text("num-requests: 4\nprompt-len: 8\nsteps: 3\nrepeats: 1\nwarmup: 1\n")
    assert scheduler.main(["--config", str(config), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["figures"]["num_requests"] == 4


def test_a_dotted_option_reaches_the_engine(capsys) -> None:
    # --hf-overrides.KEY VALUE: the model's context cut to 10 tokens, so 8 + 4 does not fit.
    with pytest.raises(SystemExit) as exc:
        latency.main(["--model", "tiny", "--input-len", "8", "--output-len", "4",
                      "--hf-overrides.max_position_embeddings", "10"])
    assert exc.value.code == 2
    assert "context (10 tokens)" in capsys.readouterr().err


@pytest.mark.parametrize("module", [latency, throughput, ttft, scheduler, serve])
def test_a_config_files_unknown_option_names_the_file_and_the_key(module, tmp_path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("not-an-option: 1\n")
    with pytest.raises(ValueError, match=r"c\.yaml: unknown option 'not-an-option'"):
        module.main(["--config", str(config)])
