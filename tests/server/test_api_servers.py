"""Several front ends over one engine-core process: each request's outputs reach the front end
that sent it, a front end that leaves has its requests aborted, and ``cadence serve
--api-server-count N`` serves, stops on SIGINT and exits 1 when the engine dies."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from cadence.engine.async_llm import AsyncLLM
from cadence.engine.core_process import ProcessEngineCoreClient, start_core_process
from cadence.engine.llm import LLM
from cadence.sampling_params import RequestOutputKind, SamplingParams
from tests.server.waiting import ServeProcess, answers_health, metric, spawn_serve, wait_until
from tests.tiny import tiny_args

ARGS = dict(max_model_len=256, num_gpu_blocks_override=96)
PROMPTS = [[72, 101, 278, 111, 295], [84, 104, 101, 32, 113, 117], [65, 32, 115, 109, 97],
           [87, 104, 121, 32, 110, 111, 116], [50, 43, 50, 61], [79, 110, 99, 101, 32]]


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          output_kind=RequestOutputKind.DELTA)


def _offline(max_tokens: int) -> list[list[int]]:
    llm = LLM(**{**vars(tiny_args(**ARGS)), "engine_process": False})
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
        return [list(o.outputs[0].token_ids) for o in outs]
    finally:
        llm.shutdown()


async def _tokens(engine: AsyncLLM, rid: str, prompt: list[int], max_tokens: int) -> list[int]:
    ids: list[int] = []
    async for out in engine.generate({"prompt_token_ids": prompt}, _params(max_tokens), rid):
        ids.extend(out.outputs[0].token_ids)
    return ids


def _over_one_core(args, body):
    """``body(a, b, core)`` with two front ends over one engine-core process; both leave after
    it, and the core then stops by itself (exit 0). Returns what ``body`` returns."""
    core, channels, facts = start_core_process(args, 2)

    async def main():
        a, b = (AsyncLLM(args, core_client=ProcessEngineCoreClient(ch, facts))
                for ch in channels)
        try:
            return await body(a, b, core)
        finally:
            a.shutdown()
            b.shutdown()

    try:
        result = asyncio.run(main())
        core.join(30)  # every front end left: the core stops by itself
        assert core.exitcode == 0
        return result
    finally:
        if core.is_alive():
            core.kill()


def test_two_front_ends_over_one_core_each_get_their_own_outputs() -> None:
    expected = _offline(12)

    async def body(a: AsyncLLM, b: AsyncLLM, core) -> None:
        # Interleaved requests from both front ends, in one batch of the core.
        jobs = [_tokens(a if i % 2 == 0 else b, f"r{i}", p, 12)
                for i, p in enumerate(PROMPTS)]
        assert list(await asyncio.gather(*jobs)) == expected
        # An abort on one front end leaves the other's request running to its end.
        long_a = a.generate({"prompt_token_ids": PROMPTS[0]}, _params(150), "long-a")
        first = await long_a.__anext__()
        assert not first.finished
        b_job = asyncio.ensure_future(_tokens(b, "b-runs", PROMPTS[1], 12))
        await a.abort("long-a")
        rest = [out async for out in long_a]
        assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
        assert await b_job == expected[1]
        # Both see the one engine: its sizes, its stats, all blocks free again.
        assert a.num_kv_blocks == b.num_kv_blocks == 96
        assert await a.get_num_free_kv_blocks() == await b.get_num_free_kv_blocks() == 95
        # A front end that leaves with a request in flight: the core aborts it for it.
        gen = b.generate({"prompt_token_ids": PROMPTS[2]}, _params(200), "orphan")
        await gen.__anext__()
        b.shutdown()
        await gen.aclose()

        async def idle() -> bool:
            stats = await a.get_scheduler_stats()
            return (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)

        for _ in range(500):
            if await idle():
                break
            await asyncio.sleep(0.01)
        assert await idle()
        assert await a.get_num_free_kv_blocks() == 95
        assert await _tokens(a, "after", PROMPTS[3], 12) == expected[3]  # a serves on
        assert core.is_alive()  # one front end is still there

    _over_one_core(tiny_args(engine_process=True, **ARGS), body)


def test_a_departed_front_ends_requests_are_aborted_in_the_core() -> None:
    """A front end leaves with a long request in flight: the core aborts the orphan at once
    rather than run it to its end for no one. How far it ran shows in the prefix cache: its
    prompt plus its whole continuation, asked for afterwards, finds few blocks cached."""
    big = dict(max_model_len=1024, num_gpu_blocks_override=160)
    max_tokens = 1000
    prompt = PROMPTS[2]
    llm = LLM(**{**vars(tiny_args(**big)), "engine_process": False})
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        whole = prompt + list(llm.generate([{"prompt_token_ids": prompt}], params,
                                           use_tqdm=False)[0].outputs[0].token_ids)
    finally:
        llm.shutdown()

    async def body(a: AsyncLLM, b: AsyncLLM, core) -> tuple[int, int]:
        gen = b.generate({"prompt_token_ids": prompt}, _params(max_tokens), "orphan")
        await gen.__anext__()  # the orphan runs in the core
        b.shutdown()  # leaves without a word: its pipes close
        await gen.aclose()
        while True:  # each call waits for the core between two steps
            stats = await a.get_scheduler_stats()
            if (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0):
                break
        probe = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        outs = [o async for o in a.generate({"prompt_token_ids": whole}, probe, "probe")]
        return outs[-1].num_cached_tokens, a.block_size

    cached, block_size = _over_one_core(tiny_args(engine_process=True, **big), body)
    # Run to its end, the orphan would have left every full block of ``whole`` cached.
    assert (len(whole) - 1) // block_size * block_size > 900
    assert cached < 512, cached


def test_a_duplicate_id_from_another_front_end_fails_alone() -> None:
    """Front end b sends a request whose id a's running request has: b's fails with an error
    naming request_id, and a's runs on to its own tokens (b's request took a's outputs over,
    and its abort ended a's, before)."""
    from cadence.engine.output_processor import RequestFailedError

    expected = _offline(40)

    async def body(a: AsyncLLM, b: AsyncLLM, core) -> None:
        gen = a.generate({"prompt_token_ids": PROMPTS[0]}, _params(40), "same")
        ids = list((await gen.__anext__()).outputs[0].token_ids)
        with pytest.raises(RequestFailedError, match="request_id: Request id same already"):
            async for _ in b.generate({"prompt_token_ids": PROMPTS[1]}, _params(40), "same"):
                pass
        await b.abort("same")  # what a server does when its request fails: a's runs on
        async for out in gen:
            ids.extend(out.outputs[0].token_ids)
        assert ids == expected[0]
        assert await _tokens(b, "same", PROMPTS[1], 40) == expected[1]  # free again

    _over_one_core(tiny_args(engine_process=True, **ARGS), body)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _serving_line(log: Path) -> str | None:
    return next((ln for ln in log.read_text().splitlines() if "API server processes" in ln), None)


@pytest.mark.slow
def test_cadence_serve_with_two_api_servers(tmp_path: Path) -> None:
    expected = _offline(10)
    args = ["tiny", "--api-server-count", "2", "--max-model-len", "256",
            "--num-gpu-blocks-override", "96"]
    with ServeProcess(args, tmp_path / "serve.log") as srv:
        # /health answers once one front end serves; the test is about both.
        wait_until(lambda: srv.log.read_text().count("Started server process") == 2,
                   "both API servers", timeout=120)
        # The engine-wide gauges show 0 before any request (a gauge of the shared files never
        # set was left out of the scrape).
        idle = httpx.get(srv.base + "/metrics", timeout=30).text
        for name in ("cadence:num_requests_running", "cadence:num_requests_waiting",
                     "cadence:kv_cache_usage_perc"):
            shown = [line for line in idle.splitlines() if line.startswith(name + "{")]
            assert shown and metric(idle, name, model_name="tiny") == 0, (name, shown)

        async def run() -> list[list[int]]:
            async with httpx.AsyncClient(base_url=srv.base, timeout=60) as client:
                async def one(p: list[int]) -> list[int]:
                    body = {"prompt": p, "max_tokens": 10, "ignore_eos": True,
                            "temperature": 0, "return_token_ids": True}
                    resp = await client.post("/v1/completions", json=body)
                    assert resp.status_code == 200, resp.text
                    return resp.json()["choices"][0]["token_ids"]

                return list(await asyncio.gather(*(one(p) for p in PROMPTS * 3)))

        assert asyncio.run(run()) == expected * 3
        # Launcher, core and two front ends: 2 API servers answer on one port.
        kids = _children(srv.proc.pid)
        assert len(kids) >= 3, kids
        # Whichever front end answers, /metrics sums them all (new connections spread over both).
        for _ in range(6):
            text = httpx.get(srv.base + "/metrics", timeout=30).text
            assert metric(text, "cadence:request_success_total", model_name="tiny",
                          finished_reason="length") == 18
            assert metric(text, "cadence:generation_tokens_total", model_name="tiny") == 180
            assert metric(text, "cadence:prompt_tokens_total", model_name="tiny") == 3 * sum(
                len(p) for p in PROMPTS)
            assert metric(text, "cadence:time_to_first_token_seconds_count",
                          model_name="tiny") == 18
            assert metric(text, "cadence:num_requests_running", model_name="tiny") == 0
            # Engine-wide figures come from front end 0 alone (the other hears only the steps
            # of its own requests): each of the 18 prompts was looked up in the prefix cache
            # once, not once per front end.
            assert metric(text, "cadence:prefix_cache_queries_total", model_name="tiny") == 3 * sum(
                len(p) for p in PROMPTS)
            assert metric(text, "cadence:cache_config_info", model_name="tiny") == 1
    assert srv.returncode == 0, srv.text
    assert "Traceback" not in srv.text
    # each front end drained, on the launcher's one forward
    assert srv.text.count("Received the launcher's stop: shutting down") == 2


def test_sigint_while_the_api_servers_start_is_a_clean_stop(tmp_path: Path) -> None:
    """A SIGINT as soon as the front ends are spawned, before they can take SIGTERM over (a
    process still importing dies of it): the launcher still exits 0, with no core left."""
    log = tmp_path / "serve.log"
    proc = spawn_serve(["tiny", "--api-server-count", "2", "--max-model-len", "128",
                        "--num-gpu-blocks-override", "64", "--port", "0"], log)
    try:
        line = wait_until(lambda: _serving_line(log), "the launcher's serving line", timeout=120)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text and "exited with status" not in text
    core_pid = int(re.search(r"engine-core process \(pid (\d+)", line).group(1))
    with pytest.raises(ProcessLookupError):
        os.kill(core_pid, 0)


@pytest.mark.slow
def test_api_servers_exit_1_when_the_engine_core_dies(tmp_path: Path) -> None:
    args = ["tiny", "--api-server-count", "2", "--max-model-len", "128",
            "--num-gpu-blocks-override", "64"]
    with ServeProcess(args, tmp_path / "serve.log") as srv:
        line = wait_until(lambda: _serving_line(srv.log), "the launcher's serving line")
        fronts, core_pid = re.search(r"pids ([\d, ]+)\) over the engine-core process \(pid (\d+)",
                                     line).groups()  # fmt: skip
        assert len(fronts.split(",")) == 2
        os.kill(int(core_pid), signal.SIGKILL)
        wait_until(lambda: srv.proc.poll() is not None, "the launcher to exit", timeout=60)
    assert srv.returncode == 1, srv.text
    # The log says how the core ended and blames no API server for it.
    assert "The engine core process exited (signal 9)" in srv.text, srv.text
    assert "stopping the others" not in srv.text and "before it started" not in srv.text


@pytest.mark.slow
def test_api_servers_stop_when_the_launcher_is_killed(tmp_path: Path) -> None:
    """SIGKILL to the launcher (nothing it can forward): its API servers see it gone and stop
    as on SIGTERM, and the engine core, left with no front end, follows; the port is free."""
    log = tmp_path / "serve.log"
    proc = spawn_serve(["tiny", "--api-server-count", "2", "--max-model-len", "128",
                        "--num-gpu-blocks-override", "64", "--port", "0"], log, new_session=True)
    pids: list[int] = []
    try:
        line = wait_until(lambda: _serving_line(log), "the launcher's serving line", timeout=120)
        fronts, core_pid = re.search(r"pids ([\d, ]+)\) over the engine-core process \(pid (\d+)",
                                     line).groups()  # fmt: skip
        pids = [int(p) for p in fronts.split(",")] + [int(core_pid)]
        wait_until(lambda: log.read_text().count("Started server process") == 2,
                   "both API servers", timeout=120)
        proc.kill()
        proc.wait(30)

        def alive(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            return True

        wait_until(lambda: not any(alive(p) for p in pids), "the orphaned processes to stop",
                   timeout=90)
    finally:
        for pid in pids:  # never leave a server behind, whatever failed
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    text = log.read_text()
    assert text.count("is gone: stopping this API server") == 2, text
    assert "Traceback" not in text, text


def test_the_launcher_watch_stops_once_and_never_cuts_a_drain_short(monkeypatch) -> None:
    """Reparented (its launcher gone), an API server sends itself one SIGTERM, its graceful
    stop; not when a stop is already under way, where a second one would end the drain's
    in-flight requests at once."""
    from cadence.server import api_servers

    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(api_servers.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    gone = os.getppid() + 1_000_000  # not this process's parent: "the launcher is gone"
    api_servers._stop_when_orphaned(gone, lambda: True, interval=0.01).join(30)
    assert sent == []
    api_servers._stop_when_orphaned(gone, lambda: False, interval=0.01).join(30)
    assert sent == [(os.getpid(), api_servers.STOP_SIGNAL)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--api-server-count", "2"], ["--engine-process"]])
def test_sigterm_to_the_process_group_drains_once(tmp_path: Path, mode: list[str]) -> None:
    """SIGTERM to every process of the server (systemd's stop, ``kill -- -PGID``): each child
    got it too, and once took it as its own stop (the engine-core process died of it, the API
    servers counted it besides the launcher's forward and ended the drain at once). The
    in-flight stream now finishes whole and the server exits 0."""
    from tests.server.conftest import free_port

    port = free_port()
    log = tmp_path / "serve.log"
    proc = spawn_serve(["tiny", *mode, "--max-model-len", "256", "--num-gpu-blocks-override",
                        "64", "--port", str(port)], log, new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: answers_health(proc, base, log), "the server", timeout=180,
                   interval=0.2)
        if mode[0] == "--api-server-count":
            wait_until(lambda: log.read_text().count("Started server process") == 2,
                       "both API servers", timeout=120)
        body = {"prompt": "Hi", "max_tokens": 120, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        frames: list[str] = []
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                frames.append(line[6:])
                if len(frames) == 1:
                    os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    import json

    assert frames[-1] == "[DONE]", frames[-3:]
    chunks = [json.loads(f) for f in frames[:-1]]
    assert all("error" not in c for c in chunks), chunks[-2:]
    assert chunks[-1]["usage"]["completion_tokens"] == 120
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert code == 0, text
    assert "during shutdown" not in text and "Traceback" not in text, text


def test_the_launcher_counts_one_stop_delivered_twice_once(monkeypatch) -> None:
    """``timeout`` (and some supervisors) signal the launcher and then its process group: the
    two SIGTERMs are one stop, forwarded once; a later signal is a second stop."""
    from types import SimpleNamespace

    from cadence.server import api_servers

    clock = [50.0]
    monkeypatch.setattr(api_servers, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    forwarded: list[int] = []
    handler = api_servers._Signals([])
    monkeypatch.setattr(handler, "forward", lambda: forwarded.append(handler.count))
    handler(signal.SIGTERM, None)
    handler(signal.SIGTERM, None)  # the group's copy, at once
    assert (handler.count, forwarded) == (1, [1])
    clock[0] += 2 * api_servers.SAME_STOP_S
    handler(signal.SIGINT, None)
    assert (handler.count, forwarded) == (2, [1, 2])


def test_a_stop_flag_is_set_from_a_signal_handler_without_a_lock() -> None:
    """Set by a signal that may arrive while the main thread is setting it already (a second
    stop): a lock there would deadlock; the flag is a plain attribute."""
    from cadence.server.launcher import StopFlag

    flag = StopFlag()
    assert not flag.requested
    previous = signal.signal(signal.SIGUSR2, lambda sig, frame: setattr(flag, "requested", True))
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        wait_until(lambda: flag.requested, "the handler to run", timeout=30, interval=0.01)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert not hasattr(flag, "__dict__")  # no room for anything but the flag


def test_a_front_ends_death_is_the_first_stop(monkeypatch) -> None:
    """An API server died and the launcher stopped the others, as a first signal would: a
    SIGTERM at once after (a supervisor stopping the failed service) is that same stop, not a
    second one that would end the others' drains at once; a later signal is a second stop."""
    from types import SimpleNamespace

    from cadence.server import api_servers

    clock = [80.0]
    monkeypatch.setattr(api_servers, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    forwarded: list[int] = []
    handler = api_servers._Signals([])
    monkeypatch.setattr(handler, "forward", lambda: forwarded.append(handler.count))
    handler.stop_all()
    handler(signal.SIGTERM, None)
    assert (handler.count, forwarded) == (1, [1])
    clock[0] += 2 * api_servers.SAME_STOP_S
    handler(signal.SIGTERM, None)
    assert (handler.count, forwarded) == (2, [1, 2])


def test_the_stop_is_forwarded_to_the_living_api_servers_only(monkeypatch) -> None:
    """Each running API server gets STOP_SIGNAL (it ignores SIGINT and SIGTERM); an exited one
    gets nothing: its pid may already be another process's."""
    from types import SimpleNamespace

    from cadence.server import api_servers

    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(api_servers.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    fronts = [SimpleNamespace(pid=pid, is_alive=lambda alive=alive: alive)
              for pid, alive in ((101, True), (102, False), (103, True))]
    api_servers._Signals(fronts).forward()
    assert sent == [(101, api_servers.STOP_SIGNAL), (103, api_servers.STOP_SIGNAL)]


def test_the_stop_reaches_the_others_when_one_api_server_exited_meanwhile(monkeypatch) -> None:
    """An API server may exit between the liveness check and the signal: the stop still
    reaches every other one, and the launcher's handler raises nothing."""
    from types import SimpleNamespace

    from cadence.server import api_servers

    sent: list[int] = []

    def kill(pid: int, sig: int) -> None:
        if pid == 102:
            raise ProcessLookupError(pid)
        sent.append(pid)

    monkeypatch.setattr(api_servers.os, "kill", kill)
    fronts = [SimpleNamespace(pid=pid, is_alive=lambda: True) for pid in (101, 102, 103)]
    api_servers._Signals(fronts).forward()
    assert sent == [101, 103]


# -- the launcher's loop over stand-in processes: each test scripts what every wait sees -----

_SHUTDOWN_S = 20.0


class _FakeProcess:
    """A spawned process as the launcher sees it: the test sets its exit code."""

    def __init__(self, name: str, pid: int) -> None:
        self.name, self.pid = name, pid
        self.sentinel = object()
        self.exitcode: int | None = None
        self.killed = False
        self.env_at_start: str | None = None

    def start(self) -> None:
        self.env_at_start = os.environ.get("PROMETHEUS_MULTIPROC_DIR")

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        pass

    def kill(self) -> None:
        self.killed, self.exitcode = True, -signal.SIGKILL


class _Closable:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class _Launch:
    """``run_api_servers`` with two API servers over stand-ins: no process, socket or real wait.
    Each entry of ``steps`` plays one ``wait`` (it returns the processes that ended); the
    clock moves only when a step moves it."""

    def __init__(self, monkeypatch, tmp_path: Path) -> None:
        from cadence.server import api_servers

        self.api = api_servers
        self.clock = [100.0]
        self.core = _FakeProcess("core", 500)
        self.fronts: list[_FakeProcess] = []
        self.channels = [SimpleNamespace(requests=_Closable(), replies=_Closable())
                         for _ in range(2)]
        self.sock = SimpleNamespace(closed=False, getsockname=lambda: ("127.0.0.1", 8123))
        self.sock.close = lambda: setattr(self.sock, "closed", True)
        self.sent: list[tuple[int, int]] = []
        self.waits: list[tuple[list, float | None]] = []
        self.steps: list[Callable[[], list[_FakeProcess]]] = []
        self.metrics_dir = tmp_path / "metrics"

        def process(target, args, name):
            self.fronts.append(_FakeProcess(name, 1001 + len(self.fronts)))
            return self.fronts[-1]

        def mkdtemp(prefix: str) -> str:
            self.metrics_dir.mkdir()
            return str(self.metrics_dir)

        def wait(objects, timeout):
            self.waits.append((list(objects), timeout))
            assert self.steps, "the launcher waited past the script"
            return [p.sentinel for p in self.steps.pop(0)()]

        monkeypatch.setattr(api_servers, "bind_socket", lambda host, port: self.sock)
        monkeypatch.setattr(api_servers, "start_core_process",
                            lambda args, n: (self.core, self.channels[:n], None))
        monkeypatch.setattr(api_servers, "multiprocessing", SimpleNamespace(
            get_context=lambda method: SimpleNamespace(Process=process)))
        monkeypatch.setattr(api_servers, "tempfile", SimpleNamespace(mkdtemp=mkdtemp))
        monkeypatch.setattr(api_servers, "time", SimpleNamespace(monotonic=lambda: self.clock[0]))
        monkeypatch.setattr(api_servers, "wait", wait)
        monkeypatch.setattr(api_servers.os, "kill", lambda pid, sig: self.sent.append((pid, sig)))
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        """A signal to the launcher, as its installed handler gets it."""
        signal.getsignal(sig)(sig, None)

    def run(self) -> int:
        from cadence.server.settings import ServerSettings

        options = self.api.FrontEndOptions(settings=ServerSettings(shutdown_timeout=_SHUTDOWN_S),
                                           served_model_name=None, api_key=(), log_level="info",
                                           log_requests=False)
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            status = self.api.run_api_servers(None, options, 2)
            assert {sig: signal.getsignal(sig) for sig in previous} == previous
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        assert not self.steps, "the launcher returned before the script's end"
        return status


def test_the_launcher_forwards_a_stop_and_cleans_up_after_the_api_servers(
        monkeypatch, tmp_path: Path) -> None:
    """SIGTERM: each API server gets the stop; the drain's deadline runs from the stop, plus
    the exit margin; every one ending (the core with the last) is a clean exit 0, and the
    launcher leaves nothing behind: no channel or socket of its own open, its handlers, the
    metrics directory and its environment variable gone."""
    launch = _Launch(monkeypatch, tmp_path)
    a, b = None, None

    def stop_then_a_ends() -> list[_FakeProcess]:
        nonlocal a, b
        a, b = launch.fronts
        # the front ends hold the channels now, the launcher no end of them
        assert all(c.requests.closed and c.replies.closed for c in launch.channels)
        assert launch.sock.closed
        launch.signal()
        assert launch.sent == [(a.pid, launch.api.STOP_SIGNAL), (b.pid, launch.api.STOP_SIGNAL)]
        launch.clock[0] += 5
        a.exitcode = 0
        return [a]

    def the_rest_end() -> list[_FakeProcess]:
        b.exitcode = launch.core.exitcode = 0
        return [b, launch.core]

    launch.steps = [stop_then_a_ends, the_rest_end]
    assert launch.run() == 0
    margin = launch.api._FRONT_END_EXIT_MARGIN_S
    assert [timeout for _, timeout in launch.waits] == [None, _SHUTDOWN_S + margin - 5]
    assert [p.env_at_start for p in launch.fronts] == [str(launch.metrics_dir)] * 2
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    assert not launch.metrics_dir.exists()
    assert not any(p.killed for p in [*launch.fronts, launch.core])
    assert len(launch.sent) == 2


def test_an_api_server_killed_by_the_groups_sigterm_while_starting_stopped_cleanly(
        monkeypatch, tmp_path: Path) -> None:
    """A SIGTERM to the whole process group reaches an API server still starting (before it
    ignores SIGTERM): it dies of it, which after that stop is its stop, not a failure."""
    launch = _Launch(monkeypatch, tmp_path)

    def group_sigterm() -> list[_FakeProcess]:
        launch.signal()
        a, b = launch.fronts
        a.exitcode, b.exitcode = -signal.SIGTERM, -launch.api.STOP_SIGNAL
        launch.core.exitcode = 0
        return [a, b, launch.core]

    launch.steps = [group_sigterm]
    assert launch.run() == 0


@pytest.mark.parametrize("code", [1, -signal.SIGKILL, -signal.SIGTERM])
def test_an_api_servers_death_stops_the_others_and_exits_1(
        monkeypatch, tmp_path: Path, code: int) -> None:
    """One API server ended by itself (a SIGTERM too: unasked, it is no stop): the launcher
    stops the others as a first signal would, with the drain's deadline, and exits 1 though
    they then stop cleanly."""
    launch = _Launch(monkeypatch, tmp_path)

    def a_dies() -> list[_FakeProcess]:
        launch.fronts[0].exitcode = code
        return [launch.fronts[0]]

    def the_rest_end() -> list[_FakeProcess]:
        assert launch.sent == [(launch.fronts[1].pid, launch.api.STOP_SIGNAL)]
        launch.fronts[1].exitcode = launch.core.exitcode = 0
        return [launch.fronts[1], launch.core]

    launch.steps = [a_dies, the_rest_end]
    assert launch.run() == 1
    assert launch.waits[1][1] == _SHUTDOWN_S + launch.api._FRONT_END_EXIT_MARGIN_S


def test_the_engine_cores_death_is_no_api_servers_failure(monkeypatch, tmp_path: Path,
                                                          caplog) -> None:
    """The core and an API server (which ends with it) are seen ending in one wait: the core's
    end is looked at first, so the launcher exits 1 for it and sends no stop to the other API
    server, which ends by itself too."""
    launch = _Launch(monkeypatch, tmp_path)

    def core_dies() -> list[_FakeProcess]:
        launch.core.exitcode, launch.fronts[0].exitcode = -signal.SIGKILL, 1
        return [launch.fronts[0], launch.core]

    def b_ends() -> list[_FakeProcess]:
        launch.fronts[1].exitcode = 1
        return [launch.fronts[1]]

    launch.steps = [core_dies, b_ends]
    with caplog.at_level("INFO", logger="cadence.serve"):
        assert launch.run() == 1
    assert launch.sent == []
    assert "The engine core process exited (signal 9)" in caplog.text
    assert "stopping the others" not in caplog.text
    assert launch.core.sentinel not in launch.waits[1][0]  # an ended core is waited on no more


def test_api_servers_that_outlive_the_stops_deadline_are_killed_and_exit_1(
        monkeypatch, tmp_path: Path) -> None:
    """An API server still running at the drain's deadline (and past the margin) is killed,
    and so is the core that then has not stopped; the launcher exits 1."""
    launch = _Launch(monkeypatch, tmp_path)

    def stop_then_a_ends() -> list[_FakeProcess]:
        launch.signal()
        launch.clock[0] += 1
        launch.fronts[0].exitcode = 0
        return [launch.fronts[0]]

    def deadline() -> list[_FakeProcess]:
        launch.clock[0] += launch.waits[-1][1]
        return []

    launch.steps = [stop_then_a_ends, deadline]
    assert launch.run() == 1
    assert [p.killed for p in launch.fronts] == [False, True]
    assert launch.core.killed


def test_a_core_that_fails_to_start_leaves_no_socket_open(monkeypatch, tmp_path: Path) -> None:
    launch = _Launch(monkeypatch, tmp_path)

    def fails(args, n):
        raise RuntimeError("the core failed to start")

    monkeypatch.setattr(launch.api, "start_core_process", fails)
    with pytest.raises(RuntimeError, match="failed to start"):
        launch.run()
    assert launch.sock.closed


# -- one API server process's main, in this process over stand-ins ------------------------


def _front_end_main(monkeypatch, on_build: Callable, play: Callable) -> tuple[
        BaseException, SimpleNamespace]:
    """Run ``api_servers._front_end_main`` as API server 1 over stand-ins for its engine
    client and server: ``on_build(seen)`` runs while the server is built, ``play(seen,
    sockets)`` is its ``run``. Returns how it ended (its SystemExit, or what ``play`` raised)
    and what was seen (``seen.stopping``: the launcher watch's "a stop is under way")."""
    import logging

    import cadence.engine.async_llm as async_llm
    import cadence.engine.core_process as core_process
    import cadence.server.launcher as launcher
    from cadence.server import api_servers

    seen = SimpleNamespace(shutdowns=0, server=None)

    class Engine:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def shutdown(self) -> None:
            seen.shutdowns += 1

    def build_server(engine, settings, **kwargs):
        seen.built = kwargs
        seen.ignored = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
        on_build(seen)
        seen.server = SimpleNamespace(exit_code=3, should_exit=False,
                                      run=lambda sockets: play(seen, sockets))
        return seen.server

    def watch(launcher_pid: int, stopping: Callable[[], bool]) -> None:
        seen.launcher, seen.stopping = launcher_pid, stopping

    monkeypatch.setattr(async_llm, "AsyncLLM", Engine)
    monkeypatch.setattr(core_process, "ProcessEngineCoreClient", lambda ch, facts: None)
    monkeypatch.setattr(launcher, "build_server", build_server)
    monkeypatch.setattr(api_servers, "_stop_when_orphaned", watch)
    options = api_servers.FrontEndOptions(settings=None, served_model_name=None, api_key=(),
                                          log_level="info", log_requests=False)
    sigs = (signal.SIGINT, signal.SIGTERM, api_servers.STOP_SIGNAL)
    previous = {sig: signal.getsignal(sig) for sig in sigs}
    level = logging.getLogger().level
    try:
        api_servers._front_end_main(1, None, None, None, options, "the-socket", 4242)
    except (SystemExit, RuntimeError) as exc:
        return exc, seen
    finally:
        logging.getLogger().setLevel(level)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    raise AssertionError("an API server's main returned")


def test_an_api_server_takes_a_stop_that_came_while_it_started(monkeypatch) -> None:
    """The launcher's stop arrives while the server is built (before it takes its signals
    over): the server finds it when it runs, and the launcher watch counts it as under way.
    The API server runs as front end 1 on the launcher's socket with the stop signal its own,
    Ctrl-C and SIGTERM ignored, and exits with its server's status."""
    from cadence.server import api_servers

    def on_build(seen) -> None:
        assert not seen.stopping()
        signal.getsignal(api_servers.STOP_SIGNAL)(api_servers.STOP_SIGNAL, None)
        assert seen.stopping()

    def play(seen, sockets) -> None:
        seen.sockets = sockets
        seen.early = seen.server.stop_requested.requested

    end, seen = _front_end_main(monkeypatch, on_build, play)
    assert isinstance(end, SystemExit) and end.code == 3
    assert seen.early and seen.shutdowns == 1
    assert seen.sockets == ["the-socket"] and seen.launcher == 4242
    assert seen.built["front_end_index"] == 1
    assert seen.built["signals"] == (api_servers.STOP_SIGNAL,)
    assert seen.ignored == [signal.SIG_IGN, signal.SIG_IGN]


def test_an_api_servers_drain_is_not_cut_by_the_launcher_watch(monkeypatch) -> None:
    """Draining (its server's should_exit), an API server's launcher watch counts a stop as
    under way and sends none; a server that fails still leaves its engine client."""

    def play(seen, sockets) -> None:
        assert not seen.stopping()
        seen.server.should_exit = True
        assert seen.stopping()
        raise RuntimeError("the server failed")

    end, seen = _front_end_main(monkeypatch, lambda seen: None, play)
    assert isinstance(end, RuntimeError), end
    assert seen.shutdowns == 1
