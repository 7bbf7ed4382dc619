"""`cadence serve` over two tensor-parallel ranks: it serves, and when a rank dies the server
exits with status 1 and leaves no process behind."""

from __future__ import annotations

import os
import signal

import httpx

from tests.engine.tp_helpers import child_pids


def test_serves_then_exits_1_when_a_rank_dies(server_factory) -> None:
    before = child_pids()
    srv = server_factory(tensor_parallel_size=2, device="cpu", async_scheduling=True,
                         app_kwargs={"engine_death_grace": 0.0})
    with httpx.Client(base_url=srv.base_url, timeout=60) as http:
        resp = http.post("/v1/completions", json={"prompt": "Hello my name is", "max_tokens": 8,
                                                  "temperature": 0, "ignore_eos": True})
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 8
        workers = srv.engine.engine_core.proc.engine_core.runner.procs
        os.kill(workers[1].pid, signal.SIGKILL)
        # Idle engine: the monitor ends it, and the server decides to exit.
        srv.thread.join(60)
        assert not srv.thread.is_alive()
        assert srv.server.exit_code == 1
    srv.stop()
    assert child_pids() == before
