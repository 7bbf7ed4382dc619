"""vLLM's flags on ``cadence serve`` and ``cadence generate``: ``--version``, ``--config``, CORS,
TLS, ``--root-path``, ``--uvicorn-log-level`` and the accepted no-ops."""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import threading
from importlib import metadata
from pathlib import Path

import httpx
import pytest

from cadence.cli import _subcommands, build_parser, main, parse_args
from cadence.engine.async_llm import AsyncLLM
from cadence.engine.engine_args import EngineArgs
from cadence.server.cli import engine_args_from, settings_from
from cadence.server.launcher import bind_socket, build_server
from cadence.server.middleware import check_ssl_files
from cadence.server.settings import ServerSettings
from tests.server.conftest import tiny_args
from tests.server.waiting import ServeProcess, wait_until


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"cadence {metadata.version('cadence')}"
    assert re.fullmatch(r"cadence \d+\.\d+\.\d+\S*", out)


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_every_flag_has_help_and_the_help_no_markup(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = _subcommands(build_parser())[command]
    assert [a.dest for a in parser._actions if not a.help] == []
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert "``" not in text and "`" not in text
    assert "--max-num-seqs MAX_NUM_SEQS" in text and "(default: 256)" in text


def test_server_flags_reach_the_settings() -> None:
    ns = parse_args(
        ["serve", "--uvicorn-log-level", "debug", "--allowed-origins", '["https://a.example"]',
         "--allowed-methods", '["GET", "POST"]', "--allowed-headers", '["Authorization"]',
         "--allow-credentials", "--ssl-keyfile", "key.pem", "--ssl-certfile", "cert.pem",
         "--root-path", "/llm", "--disable-log-stats", "--disable-web-page"]
    )  # fmt: skip
    assert settings_from(ns) == ServerSettings(
        uvicorn_log_level="debug", allowed_origins=("https://a.example",),
        allowed_methods=("GET", "POST"), allowed_headers=("Authorization",),
        allow_credentials=True, ssl_keyfile="key.pem", ssl_certfile="cert.pem", root_path="/llm",
        web_page=False,
    )  # fmt: skip
    assert ns.disable_log_stats  # accepted; cadence logs no periodic stats


def test_none_or_empty_for_an_unset_option_means_unset() -> None:
    """vLLM reads "None" and "" given to an option whose default is None as that default
    (command lines written for vLLM pass them); an option with another default still checks
    its value."""
    given = ["--quantization", "None", "--max-model-len", "None", "--tokenizer", "",
             "--reasoning-parser", "None", "--tool-call-parser", "", "--chat-template", "None"]
    plain, with_none = parse_args(["serve"]), parse_args(["serve", *given])
    assert vars(with_none) == vars(plain)
    for flag in ("--quantization", "--reasoning-parser", "--max-model-len"):
        assert getattr(parse_args(["serve", flag, "None"]), flag[2:].replace("-", "_")) is None
    with pytest.raises(SystemExit):  # --max-num-seqs defaults to a number: "None" is no count
        parse_args(["serve", "--max-num-seqs", "None"])


def test_server_flag_defaults_are_vllms() -> None:
    settings = settings_from(parse_args(["serve"]))
    assert settings.allowed_origins == settings.allowed_methods == settings.allowed_headers
    assert settings.allowed_origins == ("*",) and not settings.allow_credentials
    assert (settings.ssl_keyfile, settings.ssl_certfile, settings.root_path) == (None, None, "")
    assert settings.uvicorn_log_level == "info" and settings.web_page
    # Unless given, uvicorn's level follows --log-level (a quiet server stays quiet).
    assert settings_from(parse_args(["serve", "--log-level", "warning"])).uvicorn_log_level == (
        "warning"
    )
    ns = parse_args(["serve", "--log-level", "warning", "--uvicorn-log-level", "trace"])
    assert settings_from(ns).uvicorn_log_level == "trace"


BAD_FLAGS = [
    # A server setting's error names the flag that set it, as an engine field's does.
    (["serve", "--root-path", "llm"], "error: --root-path: root_path must start with '/'"),
    (["serve", "--port", "70000"], "error: --port: port must be in [0, 65535], got 70000."),
    (["serve", "--api-server-count", "0"], "error: --api-server-count: api_server_count must"),
    (["serve", "--response-role="], "error: --response-role: response_role must be"),
    (["serve", "--ssl-keyfile", "key.pem"], "--ssl-keyfile needs --ssl-certfile"),
    (["serve", "--ssl-certfile", "/nonexistent/cert.pem", "--port", "0"],
     "cannot load /nonexistent/cert.pem"),
    (["serve", "--revision", "main", "--port", "0"], "never downloads models"),
    (["generate", "--revision", "v2"], "never downloads models"),
    (["serve", "--quantization", "gptq", "--port", "0"], "quantization='gptq' is not supported"),
    (["generate", "--kv-cache-dtype", "fp8_e5m2"], "kv_cache_dtype='fp8_e5m2' is not supported"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "message"), BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_bad_flag_values_are_one_line(argv: list[str], message: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_exit_2(argv, capsys)
    assert line.startswith(f"cadence {argv[0]}: error: ") and message in line


def test_a_config_files_bad_value_names_its_key_and_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value the --config file set is named by its flag and the file; the same flag given on
    the command line (which wins) is named alone."""
    path = tmp_path / "serve.yaml"
    path.write_text("max-num-seqs: 0\nport: 70000\n")
    line = _one_line_exit_2(["serve", "--config", str(path), "--port", "0"], capsys)
    assert line == (f"cadence serve: error: --max-num-seqs in {path}: max_num_seqs must be 1 to "
                    "65536, got 0.")
    path.write_text("max-num-seqs: 0\n")
    line = _one_line_exit_2(["serve", f"--config={path}", "--max_num_seqs", "0"], capsys)
    assert "error: --max-num-seqs: max_num_seqs must be" in line  # the command line's
    path.write_text("port: 70000\n")
    line = _one_line_exit_2(["serve", "--config", str(path)], capsys)
    assert f"error: --port in {path}: port must be in [0, 65535], got 70000." in line


def test_port_and_api_server_count_ranges_include_their_ends() -> None:
    """Ports 0 to 65535 and 1 to 64 API servers, both ends included."""
    for port in (0, 65535):
        assert ServerSettings(port=port).port == port
    for count in (1, 64):
        assert ServerSettings(api_server_count=count).api_server_count == count
    assert settings_from(parse_args(["serve", "--port", "65535", "--api-server-count", "64"])
                         ) == ServerSettings(port=65535, api_server_count=64)
    for bad in ({"port": -1}, {"port": 65536}, {"api_server_count": 0},
                {"api_server_count": 65}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ServerSettings(**bad)


def test_cors_lists_must_be_json(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--allowed-origins", "https://a.example"])
    assert info.value.code == 2
    assert "expected a JSON list of strings" in capsys.readouterr().err


# -- --config ------------------------------------------------------------------------------------
def test_config_file_is_overridden_by_the_command_line(tmp_path: Path) -> None:
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        "model: qwen3-0.6b\n"
        "port: 9100\n"
        "--max-model-len: 1024\n"        # with dashes
        "max_num_seqs: 8\n"              # underscores
        "enable-prefix-caching: false\n"  # false: the --no- form
        "enforce_eager: true\n"
        "dtype: half\n"
        "allowed-origins: [https://a.example]\n"
        "root_path: /llm\n"
        "api_key: k\n"
        "max_num_batched_tokens: null\n"  # null: the default
    )
    ns = parse_args(["serve", "--config", str(cfg), "--max-num-seqs", "16", "--port=9200",
                     "--enable-prefix-caching"])
    args, settings = engine_args_from(ns), settings_from(ns)
    assert (settings.port, args.max_num_seqs, args.enable_prefix_caching) == (9200, 16, True)
    assert (args.model, args.max_model_len, args.enforce_eager, args.dtype) == (
        "qwen3-0.6b", 1024, True, "float16"
    )
    assert args.max_num_batched_tokens is None
    assert settings.allowed_origins == ("https://a.example",) and settings.root_path == "/llm"
    assert ns.api_key == ["k"]
    # The positional model wins over the file's, before or after --config (and a --model on
    # the command line too); file values stand where nothing overrides.
    for argv in (["serve", "tiny", "--config", str(cfg)], ["serve", "--config", str(cfg), "tiny"],
                 ["serve", f"--config={cfg}", "tiny"], ["serve", "--config", str(cfg), "--model",
                                                        "tiny"]):
        args = engine_args_from(parse_args(argv))
        assert (args.model, args.enable_prefix_caching, args.max_num_seqs) == ("tiny", False, 8)
    # Underscores on the command line too, as vLLM accepts them.
    assert engine_args_from(parse_args(["serve", "--max_model_len", "77"])).max_model_len == 77



def test_json_object_flags_take_vllms_dotted_keys(tmp_path: Path) -> None:
    """``--hf-overrides.rope_scaling.factor 2.0`` (vLLM's): keys nest at each dot and keep
    their underscores, values are JSON where they are JSON, several make one object; with a
    config file too."""
    ns = parse_args(["serve", "tiny", "--hf-overrides.max_position_embeddings", "1024",
                     "--hf_overrides.rope_scaling.factor=2.0", "--hf-overrides.note", "plain",
                     "--compilation-config.cudagraph_mode", "NONE",
                     "--default-chat-template-kwargs.enable_thinking", "false"])
    args = engine_args_from(ns)
    assert args.hf_overrides == {"max_position_embeddings": 1024,
                                 "rope_scaling": {"factor": 2.0}, "note": "plain"}
    assert args.compilation_config == {"cudagraph_mode": "NONE"}
    assert settings_from(ns).default_chat_template_kwargs == {"enable_thinking": False}
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_num_seqs: 3\n")
    ns = parse_args(["serve", "--config", str(cfg), "--hf-overrides.max_position_embeddings=77"])
    assert engine_args_from(ns).hf_overrides == {"max_position_embeddings": 77}
    assert engine_args_from(ns).max_num_seqs == 3
    for bad, said in ((["--hf-overrides", "{}", "--hf-overrides.x", "1"], "both whole and"),
                      (["--hf-overrides.x"], "needs a value"),
                      (["--hf-overrides.x", "--port", "0"], "needs a value"),
                      (["--hf-overrides.a", "1", "--hf-overrides.a.b", "2"], "a value and keys"),
                      (["--hf-overrides.a.b", "1", "--hf-overrides.a", "2"], "keys and a value")):
        with pytest.raises(ValueError, match=said):
            parse_args(["serve", "tiny", *bad])


def test_a_repeated_flag_on_the_command_line_replaces_the_files_list(tmp_path: Path) -> None:
    """generate's --prompt (given once per prompt): the command line's prompts, not the file's
    and the command line's together (its help: flags on the command line override them)."""
    import argparse

    from cadence.cli_config import expand_config

    cfg = tmp_path / "g.yaml"
    cfg.write_text("prompt: [alpha, beta]\nstop: [x]\n")
    p = argparse.ArgumentParser()
    p.add_argument("--config")
    p.add_argument("--prompt", action="append")
    p.add_argument("--stop", action="append")
    ns = p.parse_args(expand_config(p, ["--config", str(cfg), "--prompt", "gamma"]))
    assert ns.prompt == ["gamma"] and ns.stop == ["x"]
    ns = p.parse_args(expand_config(p, ["--config", str(cfg)]))
    assert ns.prompt == ["alpha", "beta"]



@pytest.mark.parametrize("flag", ["--conf", "--confi", "--con"])
def test_an_abbreviated_config_flag_reads_its_file(tmp_path: Path, flag: str) -> None:
    """argparse takes a unique prefix of --config for it: its file is read, not silently
    dropped (the file's options were looked up under the full name only)."""
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("max_num_seqs: 8\nport: 9100\n")
    for argv in (["serve", flag, str(cfg)], ["serve", f"{flag}={cfg}"]):
        ns = parse_args(argv)
        assert (engine_args_from(ns).max_num_seqs, settings_from(ns).port) == (8, 9100)


def test_config_file_for_generate(tmp_path: Path) -> None:
    cfg = tmp_path / "gen.yml"
    cfg.write_text("prompt: [Hello, The cat]\nmax_tokens: 5\ntemperature: 0.5\n"
                   "stop: '.'\nno-enable-chunked-prefill: true\n")
    ns = parse_args(["generate", "--config", str(cfg), "--max-tokens", "3"])
    assert (ns.prompt, ns.max_tokens, ns.temperature, ns.stop) == (
        ["Hello", "The cat"], 3, 0.5, ["."]
    )
    assert EngineArgs.from_cli_args(ns).enable_chunked_prefill is False


def test_config_file_lists_for_flags_of_several_values(tmp_path: Path) -> None:
    """A YAML list gives a flag that takes several values (vLLM's --served-model-name) its
    items, wherever the command line puts its positional model and whatever follows it."""
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("served-model-name: [house, house-v2]\nmax_num_seqs: 8\n")
    for argv in (["serve", "tiny", "--config", str(cfg)],
                 ["serve", "--config", str(cfg), "tiny"],
                 ["serve", "tiny", "--config", str(cfg), "--port", "9200"],
                 ["serve", f"--config={cfg}", "--", "tiny"]):
        ns = parse_args(argv)
        args = engine_args_from(ns)
        assert args.model == "tiny", argv
        assert ns.served_model_name == ["house", "house-v2"], argv
        assert args.max_num_seqs == 8
    # The command line wins; a single name may be written without a list.
    ns = parse_args(["serve", "tiny", "--config", str(cfg), "--served-model-name", "other"])
    assert ns.served_model_name == ["other"]
    cfg.write_text("served_model_name: house\n")
    assert parse_args(["serve", "tiny", "--config", str(cfg)]).served_model_name == ["house"]


CONFIG_MISTAKES = [
    ("max_model_len: 64\nfoo_bar: 1\n", "unknown option 'foo_bar'"),
    ("max_model_len: lots\n", "max_model_len: invalid value 'lots'"),
    ("dtype: float64\n", "dtype: invalid choice 'float64'"),
    ("enforce_eager: 3\n", "enforce_eager: expected true or false"),
    ("max_num_seqs: [1, 2]\n", "max_num_seqs: expected a single value"),
    ("- port\n- 9000\n", "expected a mapping of option names to values"),
    ("port: [9000\n", "not valid YAML"),
    ("config: other.yaml\n", "unknown option 'config'"),
]
SERVE_MISTAKES = [  # flags of serve only
    ("served-model-name: []\n", "served-model-name: expected at least one value"),
    ("served-model-name: [a, -b]\n", "a list item may not start with '-'"),
    ("served-model-name: [a, [b]]\n", "served-model-name: expected a single value"),
    ("served-model-name: [a, null]\n", "served-model-name: a list item may not be null"),
]


@pytest.mark.parametrize(("command", "text", "message"),
                         [(c, t, m) for c in ("serve", "generate") for t, m in CONFIG_MISTAKES]
                         + [("serve", t, m) for t, m in SERVE_MISTAKES])
def test_config_file_mistakes_are_one_line(
    command: str, text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    line = _one_line_exit_2([command, "--config", str(cfg)], capsys)
    assert line.startswith(f"cadence {command}: error: --config {cfg}: ")
    assert message in line


def test_a_config_file_that_is_not_utf8_is_named(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"\xff\xfe bad\n")
    line = _one_line_exit_2(["generate", "--config", str(cfg)], capsys)
    assert line.startswith(f"cadence generate: error: --config {cfg}: not UTF-8 text"), line


def test_config_file_must_be_yaml_and_exist(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert "must be YAML" in _one_line_exit_2(["serve", "--config", "c.json"], capsys)
    missing = str(tmp_path / "missing.yaml")
    assert "cannot read it" in _one_line_exit_2(["serve", "--config", missing], capsys)


# -- against servers -----------------------------------------------------------------------------
PREFLIGHT = {"Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization,content-type"}


def test_cors_allows_every_origin_by_default(http: httpx.Client) -> None:
    pre = http.options("/v1/completions", headers={"Origin": "https://x.example", **PREFLIGHT})
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == "*"
    resp = http.get("/v1/models", headers={"Origin": "https://x.example"})
    assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == "*"


def test_cors_and_root_path_settings(server_factory) -> None:
    srv = server_factory(app_kwargs={
        "api_key": "k", "allowed_origins": ("https://a.example",), "allow_credentials": True,
        "root_path": "/llm",
    })  # fmt: skip
    key = {"Authorization": "Bearer k"}
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        # A preflight is answered before the API-key check, for the allowed origin only.
        pre = http.options("/v1/completions", headers={"Origin": "https://a.example", **PREFLIGHT})
        assert pre.status_code == 200, pre.text
        assert pre.headers["access-control-allow-origin"] == "https://a.example"
        assert pre.headers["access-control-allow-credentials"] == "true"
        assert "POST" in pre.headers["access-control-allow-methods"]
        bad = http.options("/v1/completions", headers={"Origin": "https://b.example", **PREFLIGHT})
        assert bad.status_code == 400
        assert "access-control-allow-origin" not in bad.headers
        resp = http.get("/v1/models", headers={"Origin": "https://a.example", **key})
        assert resp.status_code == 200
        assert resp.headers["access-control-allow-origin"] == "https://a.example"
        # The key is still required, with or without the proxy's prefix on the path.
        for path in ("/v1/models", "/llm/v1/models"):
            assert http.get(path).status_code == 401, path
            assert http.get(path, headers=key).json()["data"][0]["id"] == "tiny", path
        # The prefix twice once reached the routes past the key check: no route is there.
        for path in ("/llm/llm/v1/models", "/llm/llm/stats", "/llm/llm", "/llm/llm/llm/v1/models"):
            assert http.get(path).status_code == 404, path
            assert http.get(path, headers=key).status_code == 404, path
        sneak = http.post("/llm/llm/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert sneak.status_code == 404 and sneak.json()["error"]["code"] == 404
        assert http.get("/llm/health").status_code == 200
        # A trailing-slash redirect keeps the prefix (the proxy routes only /llm/...).
        for path in ("/llm/health/", "/health/"):
            moved = http.get(path, headers=key)
            assert moved.status_code == 307, path
            assert httpx.URL(moved.headers["location"]).path == "/llm/health", path
        assert http.get("/llm").status_code == 200  # the page at /
        body = {"prompt": "Hi", "max_tokens": 2, "ignore_eos": True}
        done = http.post("/llm/v1/completions", json=body, headers=key)
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 2
    # Only the prefix as a whole path segment is stripped: under root /v, /v1/models is the
    # route itself (not /v + "1/models").
    short = server_factory(app_kwargs={"root_path": "/v"})
    with httpx.Client(base_url=short.base_url, timeout=30) as http:
        assert http.get("/v1/models").status_code == 200
        assert http.get("/v/v1/models").status_code == 200
        assert http.get("/vhealth").status_code == 404


def _self_signed(tmp_path: Path) -> tuple[str, str]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(cert), str(key)


def test_https_on_the_socket_bound_before_the_model_loads(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    settings = ServerSettings(port=0, ssl_certfile=cert, ssl_keyfile=key,
                              uvicorn_log_level="warning", shutdown_timeout=2.0)
    check_ssl_files(settings)
    with pytest.raises(ValueError, match="cannot load"):  # a key that is not one
        check_ssl_files(ServerSettings(ssl_certfile=cert, ssl_keyfile=cert))
    sock = bind_socket("127.0.0.1", 0)  # as cadence serve does
    engine = AsyncLLM(tiny_args())
    server = build_server(engine, settings)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), "the HTTPS server")
        assert server.started
        base = f"127.0.0.1:{sock.getsockname()[1]}"
        tls = ssl.create_default_context(cafile=cert)
        with httpx.Client(verify=tls, timeout=30) as client:
            assert client.get(f"https://{base}/health").status_code == 200
            resp = client.post(f"https://{base}/v1/completions",
                               json={"prompt": "Hi", "max_tokens": 2, "ignore_eos": True})
            assert resp.status_code == 200, resp.text
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served
            httpx.get(f"http://{base}/health", timeout=10)
    finally:
        server.should_exit = True
        thread.join(15)
        engine.shutdown()
        sock.close()


@pytest.mark.slow
def test_flags_reach_every_api_server(tmp_path: Path) -> None:
    """With --api-server-count 2 (settings from a --config file) every front end applies CORS,
    the root path, uvicorn's log level and the page's flag."""
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("allowed_origins: [https://a.example]\nroot_path: /llm\napi_key: k\n"
                   "uvicorn_log_level: warning\nmax_model_len: 256\n"
                   "num_gpu_blocks_override: 64\ndisable_web_page: true\n")
    with ServeProcess(["tiny", "--api-server-count", "2", "--config", str(cfg)],
                      tmp_path / "serve.log") as srv:
        for _ in range(6):  # new connections, spread over both front ends by the kernel
            pre = httpx.options(srv.base + "/llm/v1/completions",
                                headers={"Origin": "https://a.example", **PREFLIGHT}, timeout=30)
            assert pre.status_code == 200, pre.text
            assert pre.headers["access-control-allow-origin"] == "https://a.example"
            resp = httpx.get(srv.base + "/llm/v1/models",
                             headers={"Authorization": "Bearer k"}, timeout=30)
            assert resp.status_code == 200, resp.text
            assert httpx.get(srv.base + "/llm/", timeout=30).status_code == 404
            assert httpx.get(srv.base + "/llm/stats", timeout=30).status_code == 401
            stats = httpx.get(srv.base + "/llm/stats", headers={"Authorization": "Bearer k"},
                              timeout=30)
            assert stats.status_code == 200 and stats.json()["config"]["max_model_len"] == 256
    assert srv.returncode == 0, srv.text
    assert "2 API server processes" in srv.text and "Traceback" not in srv.text
    # uvicorn's info lines (start-up, access log) are off in every front end.
    assert "Started server process" not in srv.text and "/v1/models HTTP" not in srv.text


def test_the_key_is_checked_on_the_route_the_router_takes() -> None:
    """A scope whose path still carries its root_path is routed without it (Starlette's rule):
    the key check reads the same route path."""
    import asyncio

    from cadence.server.middleware import ApiKeyMiddleware, route_path

    assert route_path({"path": "/llm/v1/models", "root_path": "/llm"}) == "/v1/models"
    assert route_path({"path": "/v1/models", "root_path": "/llm"}) == "/v1/models"
    assert route_path({"path": "/llmx/v1", "root_path": "/llm"}) == "/llmx/v1"
    reached, sent = [], []

    async def app(scope, receive, send) -> None:
        reached.append(scope["path"])

    async def send(message) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    guard = ApiKeyMiddleware(app, "key")
    scope = {"type": "http", "path": "/llm/v1/models", "root_path": "/llm", "headers": [],
             "method": "GET"}
    asyncio.run(guard(scope, receive, send))
    assert not reached and sent[0]["status"] == 401
    scope["headers"] = [(b"authorization", b"Bearer k")]  # one letter of the key: not a key
    sent.clear()
    asyncio.run(guard(scope, receive, send))
    assert not reached and sent[0]["status"] == 401
    scope["headers"] = [(b"authorization", b"Bearer key")]
    asyncio.run(guard(scope, receive, send))
    assert reached == ["/llm/v1/models"]
    for bad in ((), ("",), (" ",)):
        with pytest.raises(ValueError, match="api_key"):
            ApiKeyMiddleware(app, bad)


def test_bench_and_trace_options_may_be_written_with_underscores(monkeypatch) -> None:
    """vLLM's parser takes --max_model_len for --max-model-len in every command, not only in
    serve: bench and trace hand their options on dashed, values and what follows "--" as
    given."""
    ns = parse_args(["bench", "latency", "--max_model_len", "64", "--batch_sizes=1,2",
                     "--model", "tiny_model", "--", "--keep_this"])
    assert ns.rest == ["--max-model-len", "64", "--batch-sizes=1,2", "--model", "tiny_model",
                       "--", "--keep_this"]
    # trace reads its own arguments (main hands them on before argparse).
    import cadence.cli as cli

    seen: dict[str, list[str]] = {}
    monkeypatch.setattr(cli, "_trace", lambda ns: len(seen.setdefault("rest", ns.rest)) * 0)
    assert main(["trace", "--input_len", "8"]) == 0
    assert seen["rest"] == ["--input-len", "8"]


def test_bench_serve_refuses_a_malformed_base_url_in_one_line(capsys) -> None:
    from cadence.bench import serve as bench_serve

    for url in ("http://127.0.0.1:abc", "http://[::1"):
        assert bench_serve.main(["--base-url", url, "--num-prompts", "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("cadence bench serve: error: --base-url") and "Traceback" not in err


def test_an_output_file_is_tried_not_asked(tmp_path, monkeypatch) -> None:
    """Where os.access says yes (root on a read-only mount, /proc), writing may still fail:
    the file is tried when the arguments are read; a new one is not left behind."""
    import argparse
    import os

    from cadence.bench.report import output_file

    monkeypatch.setattr(os, "access", lambda *a, **k: True)
    with pytest.raises(argparse.ArgumentTypeError, match="cannot write '/proc/cadence-x.png'"):
        output_file("/proc/cadence-x.png")
    new = tmp_path / "out.json"
    assert output_file(str(new)) == str(new) and not new.exists()
    new.write_text("{}")
    assert output_file(str(new)) == str(new) and new.read_text() == "{}"


def test_the_uvicorn_access_log_can_be_turned_off(server_factory) -> None:
    """--disable-uvicorn-access-log (vLLM's) reaches uvicorn's config (uvicorn then drops the
    access logger's handlers: a process-wide switch, so one server per process shows it)."""
    import argparse

    from cadence.server.cli import add_serve_args, settings_from

    parse = add_serve_args(argparse.ArgumentParser()).parse_args
    assert settings_from(parse(["--disable-uvicorn-access-log"])).disable_uvicorn_access_log
    assert not settings_from(parse([])).disable_uvicorn_access_log
    quiet = server_factory(app_kwargs={"disable_uvicorn_access_log": True})
    assert quiet.server.config.access_log is False
    loud = server_factory()
    assert loud.server.config.access_log is True
