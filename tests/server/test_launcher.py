"""The uvicorn server around the application (``cadence.server.launcher``): its settings reach
uvicorn, an engine death keeps the server answering 503s for the grace period before it exits,
and a second stop signal ends the requests still in flight at once."""

from __future__ import annotations

import json
import logging
import signal
import time
from types import SimpleNamespace

import httpx
import pytest

from tests.gated_core import GatedCore
from tests.server.conftest import ServerFactory
from tests.server.test_engine_failure import LONG, FaultyCore
from tests.server.waiting import wait_until


def test_keep_alive_timeout_reaches_uvicorn(server_factory: ServerFactory) -> None:
    srv = server_factory(app_kwargs={"timeout_keep_alive": 17.0})
    assert srv.server.config.timeout_keep_alive == 17.0
    assert server_factory().server.config.timeout_keep_alive == 5.0  # the setting's default


def test_after_an_engine_death_the_exit_waits_for_the_grace(server_factory: ServerFactory
                                                            ) -> None:
    grace = 600.0  # far longer than the test
    srv = server_factory(core_factory=FaultyCore, app_kwargs={"engine_death_grace": grace})
    assert srv.server.exit_deadline is None
    srv.engine.engine_core.proc.engine_core.armed.set()
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        assert http.post("/v1/completions", json={**LONG, "max_tokens": 4}).status_code == 503
        wait_until(lambda: srv.server.exit_code == 1, "the server to notice the death")
        deadline = srv.server.exit_deadline
        assert deadline is not None and deadline - time.monotonic() > grace / 2
        # Still serving, with 503s, on a new connection too.
        assert http.get("/health").status_code == 503
    assert httpx.get(srv.base_url + "/health", timeout=30).status_code == 503
    assert srv.thread.is_alive()


def test_a_second_signal_ends_the_in_flight_requests_at_once(
    server_factory: ServerFactory, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from cadence.server import launcher

    clock = [1000.0]  # the launcher's clock, moved by hand
    monkeypatch.setattr(launcher, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    caplog.set_level(logging.INFO, logger="cadence.serve")
    # A graceful shutdown would wait 600 s for the request; the engine is gated, so the
    # request cannot finish by itself either.
    srv = server_factory(core_factory=GatedCore, app_kwargs={"shutdown_timeout": 600.0})
    core: GatedCore = srv.engine.engine_core.proc.engine_core
    try:
        with httpx.Client(base_url=srv.base_url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
                frames = (line for line in r.iter_lines() if line.startswith("data: "))
                core.allow(3)
                first = json.loads(next(frames)[6:])
                assert first["choices"][0]["finish_reason"] is None
                srv.server.handle_exit(signal.SIGTERM, None)  # graceful: the request runs on
                wait_until(lambda: not srv.server.lifecycle.accepting,
                           "the shutdown to start")
                assert srv.engine.output_processor.get_num_unfinished_requests() == 1
                # The same stop delivered again at once (``timeout`` signals the process and
                # then its process group) is one stop: nothing more happens.
                srv.server.handle_exit(signal.SIGTERM, None)
                clock[0] += 2 * launcher.SAME_STOP_S
                srv.server.handle_exit(signal.SIGTERM, None)  # a second stop: end it now
                rest = list(frames)
        assert rest[-1] == "data: [DONE]"
        err = json.loads(rest[-2][6:])["error"]
        # Ended by the server's stop, not by the engine (the gated core gives up after a while).
        assert err["code"] == 503 and "server is shutting down" in err["message"], err
        srv.thread.join(30)  # a bound only: nothing is left in flight
        assert not srv.thread.is_alive() and srv.server.exit_code == 0
        said = [r.getMessage() for r in caplog.records if r.name == "cadence.serve"]
        assert sum("Received SIGTERM: shutting down" in m for m in said) == 1, said
        assert sum("during shutdown" in m for m in said) == 1, said
    finally:
        core.open()
