"""vLLM's POST /start_profile and /stop_profile on a real uvicorn server: served only where
profiling is on, behind the API key, a trace of the requests between the two calls."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import httpx
import pytest

from cadence.engine import AsyncLLM
from cadence.engine.core_proc import EngineDeadError
from tests.server.conftest import start_server, tiny_args


def test_the_routes_profile_the_requests_between_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CADENCE_TORCH_PROFILER_DIR", str(tmp_path))
    running = start_server(AsyncLLM(tiny_args()), api_key="k")
    try:
        with httpx.Client(base_url=running.base_url, timeout=60) as http:
            assert http.post("/start_profile").status_code == 401  # behind the key
            auth = {"Authorization": "Bearer k"}
            assert http.post("/start_profile", headers=auth).status_code == 200
            assert http.post("/start_profile", headers=auth).status_code == 200  # a no-op
            done = http.post("/v1/completions", headers=auth, json={
                "model": "tiny", "prompt": "Hello", "max_tokens": 3})
            assert done.status_code == 200
            assert http.post("/stop_profile", headers=auth).status_code == 200
            (trace,) = tmp_path.iterdir()
            with gzip.open(trace, "rt") as f:
                names = {e.get("name", "") for e in json.load(f)["traceEvents"]}
            assert any(n.startswith("aten::") for n in names)
            assert http.post("/stop_profile", headers=auth).status_code == 200  # a no-op
            assert len(list(tmp_path.iterdir())) == 1
            assert http.get("/health").status_code == 200
    finally:
        running.stop()


def test_an_unusable_directory_is_a_400_at_the_start(tmp_path: Path, monkeypatch) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    monkeypatch.setenv("CADENCE_TORCH_PROFILER_DIR", str(taken))
    running = start_server(AsyncLLM(tiny_args()))
    try:
        with httpx.Client(base_url=running.base_url, timeout=60) as http:
            refused = http.post("/start_profile")
            assert refused.status_code == 400
            assert "cannot be made" in refused.json()["error"]["message"]
            assert http.post("/stop_profile").status_code == 200
    finally:
        running.stop()


def test_no_routes_where_profiling_is_off(monkeypatch) -> None:
    monkeypatch.delenv("CADENCE_TORCH_PROFILER_DIR", raising=False)
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    running = start_server(AsyncLLM(tiny_args()))
    try:
        with httpx.Client(base_url=running.base_url, timeout=60) as http:
            assert http.post("/start_profile").status_code == 404
            assert http.post("/stop_profile").status_code == 404
    finally:
        running.stop()


@pytest.mark.parametrize(("error", "status"), [
    (None, 200),
    (RuntimeError("profiling is off"), 400),
    (OSError(28, "No space left on device"), 500),
    (EngineDeadError(), 503),  # a RuntimeError too, yet no fault of the request
])
def test_each_outcome_of_a_profiler_call_has_its_status(error: Exception | None,
                                                        status: int) -> None:
    from cadence.server.profile_routes import _call

    async def call() -> None:
        if error is not None:
            raise error

    resp = asyncio.run(_call(call()))
    assert resp.status_code == status
    if error is not None:
        assert str(error) in json.loads(resp.body)["error"]["message"]
