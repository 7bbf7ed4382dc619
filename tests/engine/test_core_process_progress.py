"""The engine-core process client's progress clock (what ``AsyncLLM.seconds_without_progress``
and a stall watchdog read) and the error it keeps, over plain pipes (no core process) and a
clock the test sets."""

from __future__ import annotations

import multiprocessing
from types import SimpleNamespace

import pytest

from cadence.core_types import EngineCoreOutputs
from cadence.engine import core_process
from cadence.engine.core_client import EngineDeadError
from cadence.engine.core_process import CoreChannel, ProcessEngineCoreClient


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def _client(monkeypatch: pytest.MonkeyPatch):
    clock = _Clock()
    monkeypatch.setattr(core_process, "time", clock)
    req_recv, req_send = multiprocessing.Pipe(duplex=False)
    rep_recv, rep_send = multiprocessing.Pipe(duplex=False)
    channel = CoreChannel(req_send, rep_recv)
    client = ProcessEngineCoreClient(channel, None)  # type: ignore[arg-type]
    return client, clock, req_recv, rep_send


def _add(client: ProcessEngineCoreClient, rid: str) -> None:
    client.add_request(SimpleNamespace(request_id=rid))  # type: ignore[arg-type]


def test_the_clock_runs_from_new_work_on_an_idle_core_and_from_each_step(monkeypatch) -> None:
    client, clock, req_recv, rep_send = _client(monkeypatch)
    try:
        clock.now = 10.0
        _add(client, "a")  # an idle core wakes up to it
        assert client.last_progress_time == 10.0
        clock.now = 20.0
        _add(client, "b")  # a busy core: one more request is no progress
        assert client.last_progress_time == 10.0
        clock.now = 30.0
        rep_send.send(("out", EngineCoreOutputs(finished_requests={"a"})))
        client.get_output(timeout=30)
        assert client.last_progress_time == 30.0  # a step came
        clock.now = 40.0
        _add(client, "c")  # "b" still runs
        assert client.last_progress_time == 30.0
        clock.now = 50.0
        rep_send.send(("out", EngineCoreOutputs(finished_requests={"b", "c"})))
        client.get_output(timeout=30)
        clock.now = 100.0
        _add(client, "d")  # every request finished: idle again, the clock starts afresh
        assert client.last_progress_time == 100.0
        clock.now = 110.0
        client.abort_requests(["d"])
        clock.now = 120.0
        _add(client, "e")  # the aborted one left the core idle
        assert client.last_progress_time == 120.0
        assert [req_recv.recv()[0] for _ in range(6)] == ["add"] * 4 + ["abort", "add"]
    finally:
        client.shutdown()


def test_a_shut_down_client_keeps_saying_so_after_its_pipes_close(monkeypatch) -> None:
    client, _, _, rep_send = _client(monkeypatch)
    client.shutdown()
    rep_send.close()  # the core's end goes away afterwards
    with pytest.raises(EngineDeadError, match="shut down"):
        client.get_output(timeout=30)  # the reader has seen the end of the pipe
    with pytest.raises(EngineDeadError, match="shut down"):
        client.call_utility("make_stats")
