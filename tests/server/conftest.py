"""A real uvicorn server on 127.0.0.1 (free port) in a background thread, over the tiny model."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from cadence.engine.async_llm import AsyncLLM
from cadence.engine.engine_args import EngineArgs
from cadence.engine.llm import LLM
from cadence.server.launcher import CadenceServer, build_server
from cadence.server.settings import ServerSettings
from tests.tiny import tiny_args as shared_tiny_args


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    engine: AsyncLLM
    server: CadenceServer
    thread: threading.Thread
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.engine.shutdown()


def start_server(engine: AsyncLLM, **kwargs: Any) -> RunningServer:
    """Serve ``engine`` as ``cadence serve`` does, in a thread. ``kwargs``: ``ServerSettings``
    fields, ``api_key`` and ``served_model_name``."""
    port = free_port()
    names = ("api_key", "served_model_name", "chat_template")
    app_kwargs = {k: kwargs.pop(k) for k in names if k in kwargs}
    settings = ServerSettings(
        **{"port": port, "shutdown_timeout": 2.0, "uvicorn_log_level": "warning", **kwargs}
    )
    server = build_server(engine, settings, **app_kwargs)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    return RunningServer(engine, server, thread, port)


def tiny_args(**kw: Any) -> EngineArgs:
    return shared_tiny_args(**{**dict(max_model_len=512, num_gpu_blocks_override=512), **kw})


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """The shared server: tiny model, fcfs, synchronous scheduling, 1 MiB body limit. In a
    module marked ``cpu_engine``, on the CPU on any machine: seeded outputs that must end
    within max_tokens hold for the CPU generator's draws (a GPU's draws others)."""
    cpu = request.node.get_closest_marker("cpu_engine") is not None
    args = tiny_args(device="cpu") if cpu else tiny_args()
    running = start_server(AsyncLLM(args), max_request_body_bytes=1 << 20)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    """A client on the shared server (one client: building one per call costs ~0.2 s)."""
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    """The official openai client on the shared server."""
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def offline() -> Iterator[LLM]:
    """The tiny model offline (its own defaults): the expected outputs of greedy requests."""
    llm = LLM(**vars(shared_tiny_args()))
    yield llm
    llm.shutdown()


ServerFactory = Callable[..., RunningServer]


@pytest.fixture
def server_factory() -> Iterator[ServerFactory]:
    """Start extra servers: ``server_factory(engine_kwargs..., app_kwargs={...})``, where
    ``app_kwargs`` are ``start_server``'s (settings fields, api_key, served_model_name)."""
    started: list[RunningServer] = []

    def make(
        *,
        app_kwargs: dict[str, Any] | None = None,
        core_factory: Callable[[EngineArgs], Any] | None = None,
        **engine_kwargs: Any,
    ) -> RunningServer:
        args = tiny_args(**engine_kwargs)
        factory = (lambda: core_factory(args)) if core_factory is not None else None
        running = start_server(AsyncLLM(args, core_factory=factory), **(app_kwargs or {}))
        started.append(running)
        return running

    yield make
    for running in started:
        running.stop()
