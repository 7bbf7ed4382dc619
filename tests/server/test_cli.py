"""``cadence serve`` argument handling, and ``cadence bench serve`` against a live server."""

from __future__ import annotations

import argparse
import json
import socket
import statistics
from pathlib import Path

import httpx
import pytest

from cadence.bench import serve as bench_serve
from cadence.cli import build_parser
from cadence.server.cli import add_serve_args, engine_args_from
from tests.server.waiting import ServeProcess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_parses_vllm_flags_and_positional_model() -> None:
    ns = build_parser().parse_args(
        [
            "serve",
            "/models/qwen3",
            "--host",
            "0.0.0.0",
            "--port",
            "9001",
            "--api-key",
            "k",
            "--max-model-len",
            "1024",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "2048",
            "--dtype",
            "float32",
            "--enforce-eager",
            "--scheduling-policy",
            "priority",
            "--load-format",
            "dummy",
            "--no-async-scheduling",
        ]
    )
    assert ns.func.__name__ == "run_serve"
    assert (ns.host, ns.port, ns.api_key) == ("0.0.0.0", 9001, ["k"])
    args = engine_args_from(ns)
    assert args.model == "/models/qwen3"
    assert (args.max_model_len, args.max_num_seqs, args.max_num_batched_tokens) == (1024, 8, 2048)
    assert (args.dtype, args.enforce_eager, args.scheduling_policy) == ("float32", True, "priority")
    assert (args.load_format, args.async_scheduling) == ("dummy", False)


def test_serve_takes_the_model_as_positional_or_flag_once() -> None:
    parse = add_serve_args(argparse.ArgumentParser()).parse_args
    assert engine_args_from(parse(["--model", "/models/a"])).model == "/models/a"
    assert engine_args_from(parse(["/models/a", "--model", "/models/a"])).model == "/models/a"
    with pytest.raises(ValueError, match="two models given"):
        engine_args_from(parse(["/models/a", "--model", "/models/b"]))
    # --model naming the default model is a model given too (vLLM refuses the pair alike).
    with pytest.raises(ValueError, match="two models given: '/models/a' and --model 'tiny'"):
        engine_args_from(parse(["/models/a", "--model", "tiny"]))
    args = engine_args_from(parse([]))
    assert args.model == "tiny" and type(args.model) is str
    # A --config file's model (--file-model) serves where the command line names none; the
    # command line's --model wins over it, as any flag wins over the file's value.
    assert engine_args_from(parse(["--file-model", "/models/f"])).model == "/models/f"
    assert engine_args_from(parse(["--model", "/models/a", "--file-model", "/models/f"])).model \
        == "/models/a"


def test_every_on_off_flag_has_its_no_form() -> None:
    """vLLM gives each boolean flag a --no- form (BooleanOptionalAction); the last one wins."""
    parse = add_serve_args(argparse.ArgumentParser()).parse_args
    flags = ["enforce-eager", "skip-tokenizer-init", "trust-remote-code",
             "enable-auto-tool-choice", "trust-request-chat-template", "disable-web-page",
             "enable-log-requests", "disable-log-stats", "allow-credentials",
             "enable-prompt-tokens-details", "enable-force-include-usage",
             "return-tokens-as-token-ids", "enable-request-id-headers", "enable-prefix-caching",
             "enable-chunked-prefill", "async-scheduling", "engine-process"]
    for flag in flags:
        dest = flag.replace("-", "_")
        assert getattr(parse([f"--{flag}"]), dest) is True, flag
        assert getattr(parse([f"--{flag}", f"--no-{flag}"]), dest) is False, flag
        assert getattr(parse([f"--no-{flag}", f"--{flag}"]), dest) is True, flag
    assert parse([]).enforce_eager is False and parse([]).enable_log_requests is False
    assert parse(["--enable-log-requests", "--disable-log-requests"]).enable_log_requests is False
    from cadence.cli import parse_args  # generate's own on/off flags too

    for flag in ("show-prompt", "verbose"):
        dest = flag.replace("-", "_")
        assert getattr(parse_args(["generate", f"--{flag}", f"--no-{flag}"]), dest) is False
        assert getattr(parse_args(["generate", f"--{flag}"]), dest) is True


def test_default_chat_template_kwargs_reach_the_settings() -> None:
    from cadence.server.cli import settings_from

    parse = add_serve_args(argparse.ArgumentParser()).parse_args
    ns = parse(["--default-chat-template-kwargs", '{"enable_thinking": false}'])
    assert settings_from(ns).default_chat_template_kwargs == {"enable_thinking": False}
    assert settings_from(parse([])).default_chat_template_kwargs is None


def test_vllms_engine_flags_for_what_cadence_does_are_taken() -> None:
    parse = add_serve_args(argparse.ArgumentParser()).parse_args
    args = engine_args_from(parse(["-pp", "1", "--distributed-executor-backend", "uni",
                                   "--no-enable-lora", "--no-enable-sleep-mode",
                                   "--kv-cache-memory-bytes", "2G"]))
    assert (args.pipeline_parallel_size, args.distributed_executor_backend) == (1, "uni")
    assert not args.enable_lora and not args.enable_sleep_mode
    assert args.kv_cache_memory_bytes == 2 * 1024**3


def test_serve_defaults_to_the_tiny_model() -> None:
    ns = add_serve_args(argparse.ArgumentParser()).parse_args([])
    args = engine_args_from(ns)
    assert args.model == "tiny" and ns.host == "127.0.0.1" and ns.port == 8000
    assert ns.api_key is None


def test_api_keys_come_from_the_flag_or_else_the_environment(monkeypatch, tmp_path) -> None:
    from cadence.server.cli import api_keys_from

    parse = add_serve_args(argparse.ArgumentParser()).parse_args
    for name in ("CADENCE_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert api_keys_from(parse([])) == ()
    assert api_keys_from(parse(["--api-key", "a", "b"])) == ("a", "b")
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm")  # a vLLM deployment's key keeps it closed
    assert api_keys_from(parse([])) == ("from-vllm",)
    monkeypatch.setenv("CADENCE_API_KEY", "ours")
    assert api_keys_from(parse([])) == ("ours",)
    assert api_keys_from(parse(["--api-key", "flag"])) == ("flag",)  # the flag wins
    monkeypatch.setenv("CADENCE_API_KEY", "")
    assert api_keys_from(parse([])) == ("from-vllm",)
    for bad in ([""], ["a", " "]):  # an empty key would read as "no key": an open server
        with pytest.raises(ValueError, match="--api-key: a key cannot be empty"):
            api_keys_from(parse(["--api-key", *bad]))
    # The model's path after the flag would be taken as a key, and the tiny model served.
    with pytest.raises(ValueError, match="put the model first"):
        api_keys_from(parse(["--api-key", "k", str(tmp_path)]))
    assert api_keys_from(parse([str(tmp_path), "--api-key", "k"])) == ("k",)
    # A preset's name likewise; and --served-model-name's values the same way.
    from cadence.server.cli import check_served_names

    for flag, check in (("--api-key", api_keys_from), ("--served-model-name",
                                                       check_served_names)):
        for model in ("qwen3-0.6b", "tiny", str(tmp_path)):
            with pytest.raises(ValueError, match=f"{flag} takes every value.*put the model"):
                check(parse([flag, "x", model]))
            other = "qwen3-0.6b" if model == "tiny" else model  # --model tiny is the default
            check(parse([model, flag, "x", model]))  # no error: the model came first
            check(parse(["--model", other, flag, "x", model]))
        check(parse([flag, "x", "y"]))
    monkeypatch.setenv("CADENCE_API_KEY", "  ")
    with pytest.raises(ValueError, match="blank"):
        api_keys_from(parse([]))


def test_an_empty_api_key_is_refused_where_the_app_is_built() -> None:
    from cadence.server.middleware import api_keys

    assert api_keys(None) == () and api_keys("k") == ("k",) and api_keys(["a", "b"]) == ("a", "b")
    for bad in ("", " ", ["a", ""]):
        with pytest.raises(ValueError, match="non-blank"):
            api_keys(bad)


def test_bench_serve_reports_latency_and_throughput(server, tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    rc = bench_serve.main(
        [
            "--base-url",
            server.base_url,
            "--concurrency",
            "1,4",
            "--num-prompts",
            "4",
            "--input-len",
            "12",
            "--output-len",
            "8",
            "--json",
            "--json-out",
            str(out),
        ]
    )
    assert rc == 0
    reports = json.loads(out.read_text())["reports"]
    assert [r["concurrency"] for r in reports] == [1, 4]
    for r in reports:
        assert (r["completed"], r["failed"]) == (4, 0)
        assert r["model"] == "tiny"
        assert r["total_input_tokens"] == 4 * 12
        assert r["total_output_tokens"] == 4 * 8
        assert r["request_throughput"] > 0 and r["output_throughput"] > 0
        for name in ("ttft", "tpot", "itl", "e2el"):
            assert 0 < r[f"p50_{name}_ms"] <= r[f"p90_{name}_ms"] <= r[f"p99_{name}_ms"]
    # One JSON line per level on stdout.
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    assert [json.loads(ln)["concurrency"] for ln in lines] == [1, 4]


def test_bench_serve_splits_the_load_over_client_processes(server, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    rc = bench_serve.main(
        ["--base-url", server.base_url, "--concurrency", "3", "--clients", "2", "--num-prompts",
         "5", "--input-len", "9", "--output-len", "6", "--warmup", "0", "--json-out", str(out)]
    )  # fmt: skip
    assert rc == 0
    (r,) = json.loads(out.read_text())["reports"]
    assert (r["completed"], r["failed"]) == (5, 0)
    assert (r["total_input_tokens"], r["total_output_tokens"]) == (5 * 9, 5 * 6)
    assert 0 < r["p50_ttft_ms"] <= r["max_ttft_ms"] <= r["max_e2el_ms"]
    assert r["duration_s"] * 1e3 >= r["max_e2el_ms"]
    assert bench_serve.main(["--clients", "0"]) == 2


def test_bench_serve_counts_a_text_prompts_tokens(server, tmp_path: Path) -> None:
    """Text prompts of N words are not N tokens: the input tokens are the server's count."""
    out = tmp_path / "bench.json"
    rc = bench_serve.main(
        ["--base-url", server.base_url, "--concurrency", "2", "--num-prompts", "3",
         "--input-len", "5", "--output-len", "2", "--warmup", "0", "--prompt-kind", "text",
         "--seed", "11", "--json-out", str(out)]
    )  # fmt: skip
    assert rc == 0
    (r,) = json.loads(out.read_text())["reports"]
    texts = bench_serve.make_prompts("text", 3, 5, "11:0:measured")  # the sweep's first run
    want = sum(len(server.engine.tokenizer.encode(t)) for t in texts)
    assert want != 3 * 5 and r["total_input_tokens"] == want


def test_bench_serve_says_why_requests_failed(server, capsys) -> None:
    # The fixture's server holds 512 tokens a sequence: every 600-token prompt is refused.
    rc = bench_serve.main(
        ["--base-url", server.base_url, "--concurrency", "1", "--num-prompts", "2",
         "--input-len", "600", "--output-len", "4", "--warmup", "0"]
    )  # fmt: skip
    assert rc == 1
    err = capsys.readouterr().err
    assert "2 request(s) failed: HTTP 400" in err and "512" in err, err


def test_bench_serve_poisson_arrivals_and_plot(server, tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "bench.json", tmp_path / "latency.png"
    asked: list[tuple[float, float]] = []
    offsets = bench_serve.arrival_offsets

    def recorded(num: int, rate: float, seed: int, burstiness: float = 1.0) -> list[float]:
        asked.append((rate, burstiness))
        return offsets(num, rate, seed, burstiness)

    monkeypatch.setattr(bench_serve, "arrival_offsets", recorded)
    rc = bench_serve.main(
        ["--base-url", server.base_url, "--request-rate", "50,inf", "--num-prompts", "6",
         "--input-len", "10", "--output-len", "5", "--json-out", str(out), "--plot", str(png),
         "--burstiness", "4"]
    )  # fmt: skip
    assert rc == 0
    assert (50.0, 4.0) in asked  # the measured level's arrivals took the shape asked for
    reports = json.loads(out.read_text())["reports"]
    assert [(r["request_rate"], r["concurrency"]) for r in reports] == [(50.0, None), ("inf", None)]
    assert all(r["burstiness"] == 4.0 for r in reports)
    with pytest.raises(SystemExit):  # argparse's usage error: a shape must be positive
        bench_serve.main(["--burstiness", "0"])
    for r in reports:
        assert (r["completed"], r["failed"]) == (6, 0)
        assert r["max_itl_ms"] >= r["p99_itl_ms"] >= r["p50_itl_ms"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_poisson_arrival_offsets() -> None:
    offsets = bench_serve.arrival_offsets(4000, 20.0, seed=3)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert offsets[0] == 0.0 and all(g >= 0 for g in gaps)
    # Scaled so that the offered rate is exactly the one asked for: 3999 gaps in 3999/20 s.
    assert abs(offsets[-1] - 3999 / 20.0) < 1e-9
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert 0.95 < cv < 1.05  # exponential gaps: deviation = mean
    # Gamma gaps of shape k have a coefficient of variation of 1/sqrt(k).
    for k in (0.25, 4.0):
        bursty = bench_serve.arrival_offsets(4000, 20.0, seed=3, burstiness=k)
        g = [b - a for a, b in zip(bursty, bursty[1:])]
        assert abs(statistics.pstdev(g) / statistics.fmean(g) - k ** -0.5) < 0.1 * k ** -0.5
        assert abs(bursty[-1] - 3999 / 20.0) < 1e-9
    assert bench_serve.arrival_offsets(1, 5.0, seed=0) == [0.0]
    assert bench_serve.arrival_offsets(5, float("inf"), seed=0) == [0.0] * 5
    assert bench_serve.arrival_offsets(10, 5.0, seed=1) == bench_serve.arrival_offsets(10, 5.0, 1)
    with pytest.raises(ValueError, match="request-rate"):
        bench_serve.parse_rates("0")
    assert bench_serve.main(["--request-rate", "-3"]) == 2


def test_bench_summary_percentiles() -> None:
    results = [
        bench_serve.RequestResult(
            ok=True, prompt_len=4, output_tokens=3, ttft=t, latency=t + 0.2, itl=[0.1, 0.1]
        )
        for t in (0.1, 0.2, 0.3, 0.4)
    ]
    results.append(bench_serve.RequestResult(ok=False, prompt_len=4, error="HTTP 500"))
    report = bench_serve.summarize(results, duration=2.0, concurrency=2)
    assert (report["completed"], report["failed"]) == (4, 1)
    assert report["p50_ttft_ms"] == 250.0
    assert abs(report["median_ttft_ms"] - 250.0) < 1e-9
    # Population deviation of 100, 200, 300, 400 ms: sqrt(mean of 150², 50², 50², 150²).
    assert abs(report["std_ttft_ms"] - (12500 ** 0.5)) < 1e-9
    assert report["std_itl_ms"] == 0.0 and abs(report["median_e2el_ms"] - 450.0) < 1e-9
    assert abs(report["mean_tpot_ms"] - 100.0) < 1e-9
    assert report["output_throughput"] == 6.0
    assert report["errors"] == ["HTTP 500"]


def test_cadence_serve_process_end_to_end(tmp_path: Path) -> None:
    """The real command: starts, logs its resolved settings, serves, stops cleanly on Ctrl-C."""
    args = ["tiny", "--max-model-len", "256", "--num-gpu-blocks-override", "64", "--api-key", "k"]
    with ServeProcess(args, tmp_path / "serve.log") as srv:
        resp = httpx.post(
            srv.base + "/v1/completions",
            json={"prompt": "Hello", "max_tokens": 4, "ignore_eos": True},
            headers={"Authorization": "Bearer k"},
            timeout=30,
        )
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4
    text, rc = srv.text, srv.returncode
    assert rc == 0, text
    assert "Resolved: model=tiny" in text and "max_model_len=256" in text
    assert "kv blocks=64" in text and "API key required" in text
    assert "Traceback" not in text


def test_serve_server_settings_flags() -> None:
    from cadence.server.cli import settings_from
    from cadence.server.settings import ServerSettings

    ns = add_serve_args(argparse.ArgumentParser()).parse_args(
        ["--timeout-keep-alive", "7", "--header-read-timeout", "3", "--body-read-timeout", "9",
         "--shutdown-timeout", "0", "--engine-stall-timeout", "120",
         "--max-request-body-bytes", "1024"]
    )
    settings = settings_from(ns)
    assert settings == ServerSettings(
        timeout_keep_alive=7, header_read_timeout=3, body_read_timeout=9, shutdown_timeout=0,
        engine_stall_timeout=120, max_request_body_bytes=1024,
    )
    assert settings_from(add_serve_args(argparse.ArgumentParser()).parse_args([])) == (
        ServerSettings()
    )
    for bad in ({"header_read_timeout": 0}, {"shutdown_timeout": -1},
                {"engine_stall_timeout": float("nan")}, {"body_read_timeout": float("inf")},
                {"max_request_body_bytes": 0}, {"port": 70000}):
        with pytest.raises(ValueError):
            ServerSettings(**bad)


def test_vllms_older_disable_log_requests_flag_is_accepted() -> None:
    parse = add_serve_args(argparse.ArgumentParser()).parse_args
    assert parse([]).enable_log_requests is False
    assert parse(["--disable-log-requests"]).enable_log_requests is False
    assert parse(["--enable-log-requests"]).enable_log_requests is True
    assert parse(["--enable-log-requests", "--disable-log-requests"]).enable_log_requests is False
    assert parse(["--disable-log-requests", "--enable-log-requests"]).enable_log_requests is True


def _serve_ns(*argv: str) -> argparse.Namespace:
    return add_serve_args(argparse.ArgumentParser()).parse_args(list(argv))


def test_run_serve_hands_the_flags_to_the_engine_and_the_server(monkeypatch) -> None:
    """``cadence serve``'s request logging, log length, served names and API keys reach the
    engine and the app it builds (no model loads: both are stand-ins)."""
    import logging

    from cadence.engine import async_llm
    from cadence.server import launcher
    from cadence.server.cli import run_serve

    seen: dict[str, object] = {}

    class Engine:
        model_name, max_model_len, num_kv_blocks, block_size = "tiny", 256, 64, 16

        def __init__(self, args, log_requests: bool = False, max_log_len: int | None = None):
            seen.update(model=args.model, log_requests=log_requests, max_log_len=max_log_len)
            self.engine_core = self

        def call_utility(self, method: str) -> dict:
            return {}

        def shutdown(self) -> None:
            seen["shut_down"] = True

    class Server:
        exit_code = 0

        def run(self, sockets: list) -> None:
            seen["ran"] = True

    class Sock:
        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", 1)

    def build_server(engine, settings, **kwargs):
        seen.update(kwargs)
        return Server()

    monkeypatch.setattr(async_llm, "AsyncLLM", Engine)
    monkeypatch.setattr(launcher, "bind_socket", lambda host, port: Sock())
    monkeypatch.setattr(launcher, "build_server", build_server)
    monkeypatch.setattr(logging.getLogger(), "level", logging.getLogger().level)
    ns = _serve_ns("tiny", "--enable-log-requests", "--max-log-len", "0", "--served-model-name",
                   "a", "b", "--api-key", "k1", "k2", "--log-level", "warning")
    assert run_serve(ns) == 0
    assert seen["log_requests"] is True and seen["max_log_len"] == 0
    assert seen["served_model_name"] == ["a", "b"] and tuple(seen["api_key"]) == ("k1", "k2")
    assert seen["ran"] and seen["shut_down"]
    assert logging.getLogger().level == logging.WARNING
    seen.clear()
    assert run_serve(_serve_ns("tiny")) == 0
    assert seen["log_requests"] is False and seen["max_log_len"] is None
    assert seen["served_model_name"] is None


def test_several_api_servers_run_over_an_engine_process(monkeypatch) -> None:
    from cadence.server import api_servers
    from cadence.server.cli import run_serve

    seen: dict[str, object] = {}

    def run_api_servers(args, options, count: int) -> int:
        seen.update(args=args, options=options, count=count)
        return 0

    monkeypatch.setattr(api_servers, "run_api_servers", run_api_servers)
    ns = _serve_ns("tiny", "--api-server-count", "2", "--enable-log-requests",
                   "--max-log-len", "7", "--served-model-name", "m")
    assert run_serve(ns) == 0
    options = seen["options"]
    assert seen["count"] == 2 and seen["args"].engine_process is True  # type: ignore[union-attr]
    assert (options.log_requests, options.max_log_len) == (True, 7)  # type: ignore[union-attr]
    assert options.served_model_name == ["m"]  # type: ignore[union-attr]


def test_cors_tls_and_response_flags_reach_the_settings() -> None:
    from cadence.server.cli import settings_from

    settings = settings_from(_serve_ns(
        "--allowed-origins", '["https://app.example"]', "--allowed-methods", '["GET"]',
        "--allowed-headers", '["Authorization", "Content-Type"]', "--allow-credentials",
        "--root-path", "/llm", "--disable-web-page", "--return-tokens-as-token-ids"))
    assert settings.allowed_origins == ("https://app.example",)
    assert settings.allowed_methods == ("GET",)
    assert settings.allowed_headers == ("Authorization", "Content-Type")
    assert settings.allow_credentials is True and settings.root_path == "/llm"
    assert settings.web_page is False
    assert settings.responses.return_tokens_as_token_ids is True


def test_a_blank_served_model_name_is_refused() -> None:
    from cadence.server.cli import check_served_names

    check_served_names(_serve_ns("m", "--served-model-name", "a", "b"))
    for blank in ("", "  "):
        with pytest.raises(ValueError, match="cannot be empty"):
            check_served_names(_serve_ns("m", "--served-model-name", "a", blank))
