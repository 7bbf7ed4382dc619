"""``cadence bench serve --clients N``: Ctrl-C while the client processes wait on the server ends
the command in one line (the parent's), with no traceback from the workers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from tests.child_env import child_env

# Run as a terminal's foreground job runs it: SIGINT at Python's default handler.
_CHILD = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import cadence.cli as cli
sys.exit(cli.main(sys.argv[1:]))
"""


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def _ignores_sigint(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        mask = next(line.split()[1] for line in f if line.startswith("SigIgn:"))
    return bool(int(mask, 16) & (1 << (signal.SIGINT - 1)))


@pytest.mark.skipif(not os.path.exists(f"/proc/self/task/{os.getpid()}/children"),
                    reason="Linux's /proc with child lists")
def test_ctrl_c_with_client_processes_is_one_line() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    connected = threading.Event()

    def accept() -> None:  # a server that takes every request and never answers
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            if len(held) >= 2:
                connected.set()

    threading.Thread(target=accept, daemon=True).start()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}",
         "--model", "m", "--num-prompts", "4", "--input-len", "4", "--output-len", "2",
         "--concurrency", "4", "--clients", "2", "--warmup", "0"],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        # Both client processes have a request in flight once two connections are held.
        assert connected.wait(120), child.communicate(timeout=60)
        # Only the parent answers Ctrl-C: every process it started ignores SIGINT (a worker
        # that took it would print its event loop's traceback, if the parent's end of the pool
        # did not kill it first: a race the mask below does not depend on).
        workers = _children(child.pid)
        assert len(workers) >= 2, workers
        assert all(_ignores_sigint(pid) for pid in workers), workers
        os.killpg(child.pid, signal.SIGINT)  # as Ctrl-C: the whole foreground group
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        listener.close()
        for conn in held:
            conn.close()
    assert child.returncode == 130, (child.returncode, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_client_processes_share_the_whole_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--max-concurrency 5`` over 3 client processes: caps 2, 2 and 1 (all 5 in flight),
    the sends dealt round-robin and their results put back in order. The pool is a stand-in
    that records each process's job."""
    from dataclasses import asdict
    from types import SimpleNamespace

    from cadence.bench import serve_client
    from cadence.bench.serve_client import RequestResult, Send, Target

    jobs: list[tuple] = []

    class Pool:
        def __init__(self, processes: int, initializer=None) -> None:
            self.processes = processes

        def map(self, fn, args):  # noqa: ANN001
            jobs.extend(args)
            return [([asdict(RequestResult(True, s.prompt_len)) for s in job[1]], 1.0 + i, 3.0)
                    for i, job in enumerate(args)]

        def terminate(self) -> None:
            pass

        def join(self) -> None:
            pass

    fake = SimpleNamespace(get_context=lambda method: SimpleNamespace(Pool=Pool))
    monkeypatch.setattr(serve_client, "multiprocessing", fake)
    sends = [Send({"prompt": str(i)}, prompt_len=i) for i in range(7)]
    results, duration = serve_client.run_in_processes(Target("http://x", {}, 1.0), sends,
                                                      cap=5, processes=3)
    assert [job[2] for job in jobs] == [2, 2, 1]
    assert [[s.prompt_len for s in job[1]] for job in jobs] == [[0, 3, 6], [1, 4], [2, 5]]
    assert [r.prompt_len for r in results] == list(range(7))
    assert duration == 2.0  # first start (1.0) to last end (3.0)
