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


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups")
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
