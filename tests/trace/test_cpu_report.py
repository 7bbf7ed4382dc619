"""``cadence trace`` on CPU with the tiny model: the report's figures are gaps.py's, its GEMM rows
are the model's linear layers (shapes from the Hugging Face config), and the page renders in
headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from cadence.cli import main as cadence_main
from cadence.model.tiny import ensure_tiny_model
from nsys.gaps import summarize

TINY = ["--model", "tiny", "--device", "cpu", "--input-len", "8"]


@pytest.fixture(scope="module")
def decode_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace")
    argv = ["trace", *TINY, "--batch-size", "2", "--steps", "4", "--warmup-steps", "2",
            "--out", str(out / "r.html"), "--json-out", str(out / "r.json"),
            "--bandwidth", "0.1"]
    assert cadence_main(argv) == 0
    return out


def _hf_config() -> dict:
    return json.loads((ensure_tiny_model() / "config.json").read_text())


def _linear_shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    qkv = (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * head_dim
    return {"qkv_proj": (qkv, hidden), "o_proj": (hidden, cfg["num_attention_heads"] * head_dim),
            "gate_up_proj": (2 * inter, hidden), "down_proj": (hidden, inter),
            "lm_head": (cfg["vocab_size"], hidden)}


def test_figures_are_gaps_figures(decode_report) -> None:
    figures = json.loads((decode_report / "r.json").read_text())
    trace = decode_report / "r.trace.json"
    assert figures["trace"] == str(trace)
    gaps = summarize(trace)
    assert figures["summary"] == json.loads(json.dumps(gaps))
    assert gaps["num_steps"] == 4 and not gaps["has_gpu"]
    assert {"schedule", "prepare", "forward", "sample", "update"} <= set(gaps["phases_us"])
    assert figures["reference"] == "host_us"
    assert figures["reference_us_per_step"] == pytest.approx(gaps["host_us"]["mean"])
    assert figures["run"]["tokens"] == 4 * 2  # four full decode steps of two requests
    # Each op's share is of the mean host step; the outermost ops cannot exceed the steps.
    assert 0 < figures["rows_share"] <= 1


def test_gemm_rows_are_the_models_layers(decode_report) -> None:
    figures = json.loads((decode_report / "r.json").read_text())
    cfg = _hf_config()
    layers, elem = cfg["num_hidden_layers"], 4  # float32
    rows = {r["op"]: r for r in figures["kernels"] if r["name"] == "aten::linear"}
    expected = {}
    for layer, (n, k) in _linear_shapes(cfg).items():
        m = 2  # one decode token per request
        expected[f"gemm {layer} M={m} N={n} K={k}"] = (
            1 if layer == "lm_head" else layers, elem * (n * k + m * k + m * n))
    assert set(rows) == set(expected)
    for op, (calls, nbytes) in expected.items():
        r = rows[op]
        assert r["cls"] == "gemm" and r["calls_per_step"] == calls
        assert r["bytes_per_call"] == nbytes
        assert r["gbps"] == pytest.approx(nbytes / r["us_per_call"] / 1e3)
        assert r["ratio"] == pytest.approx(r["gbps"] / 100)  # --bandwidth 0.1 TB/s


def test_html_has_pictures_and_tables(decode_report) -> None:
    page = (decode_report / "r.html").read_text()
    assert len(re.findall(r'src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}"', page)) == 2
    for table in ('id="kernels"', 'id="classes"', 'id="summary"'):
        assert table in page
    assert "http://" not in page and "https://" not in page  # opens from file:// alone


def test_prefill_and_compare(decode_report, tmp_path) -> None:
    out = tmp_path / "p.html"
    argv = ["trace", *TINY, "--load", "prefill", "--steps", "2", "--warmup-steps", "1",
            "--out", str(out), "--json-out", str(tmp_path / "p.json"),
            "--compare", str(decode_report / "r.json")]
    assert cadence_main(argv) == 0
    figures = json.loads((tmp_path / "p.json").read_text())
    assert figures["summary"]["num_steps"] == 2
    cfg = _hf_config()
    qkv_n, hidden = _linear_shapes(cfg)["qkv_proj"]
    calls = {r["op"]: r["calls_per_step"] for r in figures["kernels"] if r["name"] == "aten::linear"}
    # Every step prefills one whole 8-token prompt; only its last position reaches the head.
    assert calls[f"gemm qkv_proj M=8 N={qkv_n} K={hidden}"] == cfg["num_hidden_layers"]
    assert calls[f"gemm lm_head M=1 N={cfg['vocab_size']} K={hidden}"] == 1
    decode = json.loads((decode_report / "r.json").read_text())
    cmp = figures["compare"]
    by_op = {(r["name"], r["op"]): r for r in cmp["kernels"]}
    for r in decode["kernels"]:
        assert by_op[(r["name"], r["op"])]["other_us_per_step"] == pytest.approx(r["us_per_step"])
    assert "Compared with" in out.read_text()


def test_mixed_steps_hold_the_batch_and_one_prompt(tmp_path) -> None:
    argv = ["trace", *TINY, "--load", "mixed", "--batch-size", "2", "--steps", "3",
            "--warmup-steps", "2", "--out", str(tmp_path / "m.html"),
            "--json-out", str(tmp_path / "m.json")]
    assert cadence_main(argv) == 0
    figures = json.loads((tmp_path / "m.json").read_text())
    cfg = _hf_config()
    qkv_n, hidden = _linear_shapes(cfg)["qkv_proj"]
    calls = {r["op"]: r["calls_per_step"] for r in figures["kernels"] if r["name"] == "aten::linear"}
    # Two decode rows and an 8-token prompt in every measured step; the head sees 2 + 1 rows.
    assert {op for op in calls if op.startswith("gemm qkv_proj")} == {
        f"gemm qkv_proj M=10 N={qkv_n} K={hidden}"}
    assert calls[f"gemm qkv_proj M=10 N={qkv_n} K={hidden}"] == cfg["num_hidden_layers"]
    assert calls[f"gemm lm_head M=3 N={cfg['vocab_size']} K={hidden}"] == 1
    assert figures["run"]["tokens"] == 3 * 3


def test_a_config_file_gives_the_options(tmp_path) -> None:
    # vLLM's --config, as serve and the benchmarks take it; the command line wins.
    config = tmp_path / "trace.yaml"
    config.write_text("model: tiny\ndevice: cpu\ninput_len: 8\nload: mixed\nbatch-size: 2\n"
                      "steps: 5\nwarmup-steps: 2\n")
    argv = ["trace", "--config", str(config), "--steps", "3", "--out", str(tmp_path / "c.html"),
            "--json-out", str(tmp_path / "c.json")]
    assert cadence_main(argv) == 0
    figures = json.loads((tmp_path / "c.json").read_text())
    assert figures["run"]["tokens"] == 3 * 3  # three steps of two decodes and a prompt


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_renders_in_headless_chromium(decode_report, tmp_path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("NO CHROMIUM: the screenshot test of the trace report did not run "
                    "(install Debian's chromium package)")
    page = (decode_report / "r.html").resolve().as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run([browser, *flags, "--virtual-time-budget=5000", "--dump-dom", page],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    widths = re.search(r'data-images="([0-9,]+)"', dom)
    assert widths is not None, "the page's load handler did not run"
    assert [int(w) > 300 for w in widths.group(1).split(",")] == [True, True]  # both decoded
    assert 'id="kernels"' in dom and "aten::linear" in dom
    shot = tmp_path / "shot.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1280,1600", page],
                   capture_output=True, timeout=120, check=True)
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (1600, 1280)
    # Not a blank page: the timeline and the tables put many non-white pixels on it.
    assert (pixels[..., :3].min(axis=-1) < 0.9).mean() > 0.05


@pytest.mark.parametrize(("extra", "needle"), [
    (["--compare", "/nonexistent/other.json"], "--compare"),
    (["--bandwidth", "-1"], "--bandwidth"),
    (["--bandwidth", "nan"], "--bandwidth"),
    (["--from-trace", "/nonexistent/t.json"], "--from-trace"),
    # Files the report writes: a directory, or a folder where none can be made.
    (["--json-out", "{tmp}"], "--json-out"),
    (["--json-out", "/proc/no/a.json"], "--json-out"),
    (["--trace-out", "{tmp}"], "--trace-out"),
    (["--out", "{tmp}"], "--out"),
])
def test_bad_options_are_refused_before_the_run(tmp_path, monkeypatch, capsys, extra,
                                                needle) -> None:
    """A mistake that needs no trace is told at once, not after minutes of profiling."""
    from cadence.trace import cli as trace_cli

    def never(*args, **kwargs):
        raise AssertionError("the engine ran before the options were checked")

    monkeypatch.setattr(trace_cli, "_run", never)
    extra = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    with pytest.raises(SystemExit) as exit_info:
        cadence_main(["trace", *TINY, "--out", str(tmp_path / "r.html"), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("cadence trace: error: ") and needle in err, err


@pytest.mark.parametrize("content", [
    "{}", "[]", '{"summary": {}, "kernels": 3}', '{"summary": {}, "kernels": [{"name": 1}]}',
    '{"summary": {"host_us": 5}, "kernels": []}',
])
def test_a_compare_file_that_is_no_report_is_refused_before_the_run(
        tmp_path, monkeypatch, capsys, content: str) -> None:
    from cadence.trace import cli as trace_cli

    def never(*args, **kwargs):
        raise AssertionError("the engine ran before the options were checked")

    monkeypatch.setattr(trace_cli, "_run", never)
    other = tmp_path / "other.json"
    other.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        cadence_main(["trace", *TINY, "--out", str(tmp_path / "r.html"), "--compare", str(other)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--compare" in err and "not the --json-out of a cadence trace" in err, err


@pytest.mark.parametrize(("content", "needle"), [
    (b"{not json", "is not a trace in JSON"),
    (b"\xff\xfe\x00", "is not a trace in JSON"),
    (b'{"traceEvents": 5}', "a 'traceEvents' list"),
    (b"[1, 2]", "no host ranges named"),
])
def test_a_from_trace_file_that_is_no_trace_is_one_line(tmp_path, capsys, content: bytes,
                                                        needle: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        cadence_main(["trace", "--from-trace", str(bad), "--out", str(tmp_path / "r.html")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
