"""GET /stats and its per-second recorder: values checked against hand-computed sums and
against what the server's responses report (usage), never against the recorder's own code."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest

from cadence.config import CacheConfig, EngineConfig, GraphConfig, SchedulerConfig
from cadence.core_types import SchedulerStats
from cadence.metrics import FinishedRequestStats, IterationStats
from cadence.server.live_stats import SecondsRecorder, engine_config_summary
from tests.gated_core import GatedCore
from tests.server.waiting import wait_until


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def sched(running: int, waiting: int = 0, kv: float = 0.0) -> SchedulerStats:
    return SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=kv)


def test_seconds_hold_sums_means_and_gauges_with_gaps_filled() -> None:
    clock = Clock()
    rec = SecondsRecorder(window_s=60, clock=clock)
    clock.t = 100.2  # second 0
    rec.record(sched(2, 1, 0.25), IterationStats(num_prompt_tokens=7, num_generation_tokens=2,
                                                 time_to_first_tokens=[0.010, 0.030]))
    clock.t = 100.9
    rec.record(sched(2, 0, 0.5), IterationStats(num_generation_tokens=2,
                                                inter_token_latencies=[0.004, 0.006]))
    clock.t = 101.5  # second 1
    fin = FinishedRequestStats("a", "length", 1.0, 7, 5)
    rec.record(sched(1, 0, 0.125), IterationStats(num_generation_tokens=1,
                                                  inter_token_latencies=[0.02],
                                                  finished_requests=[fin]))
    clock.t = 104.1  # seconds 2 and 3 saw nothing; second 4 is the current one
    rec.record(sched(0), None)
    rows = rec.history()
    assert [r["t"] for r in rows] == [0, 1, 2, 3]  # complete seconds only
    r0, r1, r2, r3 = rows
    assert (r0["running"], r0["waiting"], r0["kv_cache_usage"]) == (2, 0, 0.5)  # last seen
    assert (r0["prompt_tokens"], r0["generation_tokens"], r0["finished"]) == (7, 4, 0)
    assert r0["ttft_mean"] == pytest.approx(0.020) and r0["ttft_max"] == pytest.approx(0.030)
    assert r0["itl_mean"] == pytest.approx(0.005) and r0["itl_max"] == pytest.approx(0.006)
    assert (r1["running"], r1["generation_tokens"], r1["finished"]) == (1, 1, 1)
    assert r1["ttft_mean"] is None and r1["itl_mean"] == pytest.approx(0.02)
    for gap in (r2, r3):  # the gauges carried on, nothing counted
        assert (gap["running"], gap["kv_cache_usage"]) == (1, 0.125)
        assert (gap["generation_tokens"], gap["finished"], gap["itl_mean"]) == (0, 0, None)
    assert rec.latest == sched(0)
    assert [r["t"] for r in rec.history(since=2)] == [3]
    clock.t = 105.0
    assert rec.history(since=3)[0]["running"] == 0  # second 4, now complete
    json.dumps(rows)  # JSON as it is


def test_the_window_keeps_the_last_seconds_only() -> None:
    clock = Clock()
    rec = SecondsRecorder(window_s=3, clock=clock)
    for s in range(10):
        clock.t = 100.5 + s
        rec.record(None, IterationStats(num_generation_tokens=s))
    clock.t = 110.0
    rows = rec.history()
    assert [(r["t"], r["generation_tokens"]) for r in rows] == [(7, 7), (8, 8), (9, 9)]
    assert rec.history(since=8) == rows[2:]


def test_the_configuration_summary_lists_graph_sizes() -> None:
    cfg = EngineConfig(device="cuda", scheduler=SchedulerConfig(max_num_seqs=8, policy="priority",
                                                                async_scheduling=True),
                       cache=CacheConfig(block_size=32), graphs=GraphConfig(max_capture_tokens=64))
    engine = SimpleNamespace(config=cfg, tokenizer=None, max_model_len=1024, block_size=32,
                             num_kv_blocks=99)
    s = engine_config_summary(engine, "served")  # type: ignore[arg-type]
    assert s["graphs"] == {"enabled": True, "decode_batch_sizes": [1, 2, 4, 8],
                           "mixed_token_sizes": [16, 32, 48, 64], "emulated": False}
    assert (s["dtype"], s["policy"], s["async_scheduling"], s["has_tokenizer"]) == (
        "bfloat16", "priority", True, False)
    assert (s["max_num_seqs"], s["max_num_batched_tokens"]) == (8, 8192)  # 8192: the default
    eager = EngineConfig(graphs=GraphConfig(enforce_eager=True))
    s = engine_config_summary(SimpleNamespace(**{**vars(engine), "config": eager}), "x")  # type: ignore[arg-type]
    assert s["graphs"] == {"enabled": False} and s["dtype"] == "float32"


def test_stats_route_counts_what_the_responses_report(server, http: httpx.Client) -> None:
    first = http.get("/stats")
    assert first.status_code == 200 and first.headers["cache-control"] == "no-store"
    body = first.json()
    cfg = body["config"]  # the server's engine: tests/server/conftest.py's tiny_args
    assert (cfg["model"], cfg["max_model_len"], cfg["num_kv_blocks"]) == ("tiny", 512, 512)
    assert (cfg["policy"], cfg["async_scheduling"], cfg["has_tokenizer"]) == ("fcfs", False, True)
    assert body["status"] == "serving" and body["window_s"] == 300
    before = body["second"]
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    for n in (5, 9):
        resp = http.post("/v1/completions", json={"prompt": "Hello my name is", "max_tokens": n,
                                                  "ignore_eos": True, "temperature": 0})
        for k in usage:
            usage[k] += resp.json()["usage"][k]
    rows: list[dict] = []

    def counted() -> bool:
        rows.extend(http.get("/stats", params={"since": rows[-1]["t"] if rows else before - 1})
                    .json()["history"])
        return sum(r["finished"] for r in rows) == 2

    wait_until(counted, "both requests in complete seconds")
    assert sum(r["generation_tokens"] for r in rows) == usage["completion_tokens"] == 14
    assert sum(r["prompt_tokens"] for r in rows) == usage["prompt_tokens"]
    assert any(r["ttft_mean"] is not None for r in rows)
    assert any(r["itl_mean"] is not None for r in rows)
    again = http.get("/stats", params={"since": 0}).json()
    assert "config" not in again and again["now"]["running"] == 0


def test_stats_route_refuses_a_bad_since(http: httpx.Client) -> None:
    resp = http.get("/stats", params={"since": "soon"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "since"


def test_stats_answers_while_the_engine_is_mid_step(server_factory) -> None:
    """A running request's stats come from its step outputs: /stats answers while the engine
    waits (here at a test gate) instead of queueing behind the step."""
    srv = server_factory(core_factory=GatedCore)
    core: GatedCore = srv.engine.engine_core.proc.engine_core
    try:
        with httpx.Client(base_url=srv.base_url, timeout=20) as http:
            body = {"prompt": "Hello", "max_tokens": 50, "ignore_eos": True, "stream": True}
            with http.stream("POST", "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                core.allow()
                assert next(lines).startswith("data: ")
                core.wait_at_gate()
                now = http.get("/stats").json()["now"]
                assert (now["running"], now["waiting"]) == (1, 0) and now["kv_cache_usage"] > 0
            core.open()  # the stream is closed: the request is aborted
            wait_until(lambda: http.get("/stats").json()["now"]["running"] == 0,
                       "the aborted request gone from /stats")
    finally:
        core.open()


def test_stats_say_shutting_down_while_the_server_drains(server_factory) -> None:
    """A draining server (its /health a 503) still answers /stats, with the status the page
    shows: not "serving"."""
    srv = server_factory()
    with httpx.Client(base_url=srv.base_url, timeout=20) as http:
        assert http.get("/stats").json()["status"] == "serving"
        srv.server.lifecycle.stop_accepting()
        assert http.get("/health").status_code == 503
        resp = http.get("/stats")
        assert resp.status_code == 200 and resp.json()["status"] == "shutting down"


def test_api_key_guards_stats_and_the_page_reveals_nothing(server_factory) -> None:
    srv = server_factory(app_kwargs={"api_key": "k1", "served_model_name": "house-model"})
    with httpx.Client(base_url=srv.base_url, timeout=20) as http:
        assert http.get("/stats").status_code == 401
        assert http.get("/stats", headers={"Authorization": "Bearer nope"}).status_code == 401
        ok = http.get("/stats", headers={"Authorization": "Bearer k1"})
        assert ok.status_code == 200 and ok.json()["config"]["served_model_name"] == "house-model"
        page = http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "house-model" not in page.text and "tiny" not in page.text
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp
        assert "https:" not in csp and "http:" not in page.text.replace("http://www.w3.org", "")


def test_the_page_can_be_turned_off(server_factory) -> None:
    srv = server_factory(app_kwargs={"web_page": False})
    with httpx.Client(base_url=srv.base_url, timeout=20) as http:
        assert http.get("/").status_code == 404
        assert http.get("/stats").status_code == 200


def test_every_page_file_is_package_data() -> None:
    """A non-editable install ships the page: pyproject's package-data names every file."""
    import fnmatch
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = Path(__file__).resolve().parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["cadence.server"]
    files = [p.relative_to(root / "cadence/server").as_posix()
             for p in (root / "cadence/server/static").iterdir()]
    assert sorted(files) == ["static/page.css", "static/page.html", "static/page.js"]
    for f in files:
        assert any(fnmatch.fnmatch(f, pat) for pat in patterns), f


def test_the_oldest_row_carries_the_gauges_from_before_the_window() -> None:
    """A gauge (running requests) seen before the window still holds in the window's first
    seconds when nothing was recorded there: the recorder keeps the last second before the
    window to carry from, and a second's TTFT and ITL maxima are over all of its records."""
    clock = Clock()
    rec = SecondsRecorder(window_s=3, clock=clock)
    clock.t = 100.5  # second 0
    rec.record(sched(7), None)
    clock.t = 104.5  # second 4: seconds 1-3 saw nothing
    rec.record(sched(7), IterationStats(time_to_first_tokens=[0.5],
                                        inter_token_latencies=[0.3, 0.05]))
    rec.record(None, IterationStats(time_to_first_tokens=[0.1], inter_token_latencies=[0.2]))
    clock.t = 105.0
    rows = rec.history()
    assert [(r["t"], r["running"]) for r in rows] == [(2, 7), (3, 7), (4, 7)]
    assert rows[-1]["ttft_max"] == pytest.approx(0.5)
    assert rows[-1]["itl_max"] == pytest.approx(0.3)
    assert rows[-1]["itl_mean"] == pytest.approx(0.55 / 3, abs=1e-6)  # rounded to 6 places
    assert len(rec._seconds) <= rec.window_s + 1  # still bounded


def test_stats_document_now_and_a_second_with_token_latencies_only() -> None:
    """``now`` carries the latest scheduler totals as they are (hits apart from queries); a
    second whose only latencies are inter-token ones (no first token in it) shows their max."""
    from cadence.server.live_stats import stats_document

    clock = Clock()
    rec = SecondsRecorder(window_s=60, clock=clock)
    clock.t = 100.5  # second 0
    rec.record(SchedulerStats(1, 0, 0.1, prefix_cache_queries=10, prefix_cache_hits=4,
                              num_preemptions=3),
               IterationStats(num_generation_tokens=2, inter_token_latencies=[0.02, 0.03]))
    clock.t = 101.2
    doc = stats_document(rec, "serving", "v", -1, None)
    assert doc["now"] == {"running": 1, "waiting": 0, "kv_cache_usage": 0.1,
                          "num_preemptions": 3, "prefix_cache_queries": 10,
                          "prefix_cache_hits": 4}
    (row,) = doc["history"]
    assert row["ttft_max"] is None and row["ttft_mean"] is None
    assert row["itl_max"] == 0.03 and row["itl_mean"] == pytest.approx(0.025)
    assert "config" not in doc and doc["second"] == 1
