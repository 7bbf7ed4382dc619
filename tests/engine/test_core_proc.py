"""EngineCoreProc and the in-process client, over the real engine core with the tiny model."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import types
from typing import Any

import pytest

from cadence.core_types import EngineCoreOutputs, EngineCoreRequest
from cadence.engine.core import EngineCore
from cadence.engine.core_client import EngineDeadError, InprocEngineCoreClient
from cadence.engine.core_proc import EngineCoreProc, OutputQueue
from cadence.engine.engine_args import EngineArgs
from cadence.sampling_params import SamplingParams
from tests.tiny import tiny_args as shared_tiny_args

PROMPT = [72, 101, 278, 111, 295, 121, 290, 346]


def tiny_args(**kw: Any) -> EngineArgs:
    return shared_tiny_args(**{**dict(max_model_len=256, num_gpu_blocks_override=128), **kw})




def make_request(
    rid: str, max_tokens: int = 8, prompt: list[int] | None = None
) -> EngineCoreRequest:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    return EngineCoreRequest(rid, list(prompt or PROMPT), params, eos_token_id=None)


class InstrumentedCore(EngineCore):
    """The real core, counting steps and optionally failing at a given step."""

    def __init__(self, args: EngineArgs, fail_at_step: int | None = None) -> None:
        super().__init__(args)
        self.steps = 0
        self.fail_at_step = fail_at_step
        self.step_thread: int | None = None
        self.shut_down = False

    @property
    def step_fn(self):
        inner = super().step_fn

        def counted():
            self.steps += 1
            self.step_thread = threading.get_ident()
            if self.fail_at_step is not None and self.steps >= self.fail_at_step:
                raise RuntimeError("injected engine failure")
            return inner()

        return counted

    def shutdown(self) -> None:
        self.shut_down = True
        super().shutdown()

    def hold(self, entered: threading.Event, release: threading.Event) -> None:
        """A utility that keeps the loop busy until ``release`` is set."""
        entered.set()
        assert release.wait(10)


def collect(
    client: InprocEngineCoreClient, done: set[str], timeout: float = 30.0
) -> dict[str, list[int]]:
    """Read outputs until every id in ``done`` has finished; tokens per request."""
    tokens: dict[str, list[int]] = {}
    pending = set(done)
    deadline = time.monotonic() + timeout
    while pending:
        assert time.monotonic() < deadline, f"requests never finished: {pending}"
        outs = client.get_output(timeout=max(0.01, deadline - time.monotonic()))
        for o in outs.outputs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                pending.discard(o.request_id)
    return tokens


@pytest.fixture(scope="module")
def args() -> EngineArgs:
    return tiny_args()


def test_generates_in_engine_thread_and_matches_offline(args: EngineArgs) -> None:
    cores: list[InstrumentedCore] = []

    def factory() -> InstrumentedCore:
        cores.append(InstrumentedCore(args))
        return cores[-1]

    client = InprocEngineCoreClient(factory)
    try:
        client.add_request(make_request("a", 8))
        client.add_request(make_request("b", 5))
        tokens = collect(client, {"a", "b"})
        assert len(tokens["a"]) == 8 and len(tokens["b"]) == 5
        # Same prompt, greedy: b is a prefix of a.
        assert tokens["a"][:5] == tokens["b"]
        assert cores[0].step_thread == client.proc.thread.ident
        assert cores[0].step_thread != threading.get_ident()
    finally:
        client.shutdown()
    # Offline, on a core of its own: the same tokens.
    core = EngineCore(args)
    core.add_request(make_request("a", 8))
    offline: list[int] = []
    while core.has_work():
        outs, _ = core.step_fn()
        for o in (outs or EngineCoreOutputs()).outputs:
            offline.extend(o.new_token_ids)
    core.shutdown()
    assert offline == tokens["a"]


class RecordingQueue:
    """The engine loop's input queue, recording how the loop waits on it."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self.blocked = False  # the loop waits in a blocking get() right now
        self.timeouts: list[float | None] = []  # of every blocking get()

    def put(self, item: Any) -> None:
        self._queue.put(item)

    def get_nowait(self) -> Any:
        return self._queue.get_nowait()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not block:
            return self._queue.get_nowait()
        with self._cond:
            self.timeouts.append(timeout)
            self.blocked = True
            self._cond.notify_all()
        try:
            return self._queue.get(timeout=timeout)
        finally:
            with self._cond:
                self.blocked = False

    def wait_blocked(self, timeout: float = 30.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.blocked, timeout), "the loop never blocked"


def test_blocks_when_idle_instead_of_spinning(
    args: EngineArgs, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cadence.engine.core_proc as core_proc

    inputs = RecordingQueue()
    fake_queue = types.SimpleNamespace(SimpleQueue=lambda: inputs, Empty=queue.Empty)
    monkeypatch.setattr(core_proc, "queue", fake_queue)
    holder: list[InstrumentedCore] = []
    client = InprocEngineCoreClient(lambda: holder.append(InstrumentedCore(args)) or holder[-1])
    try:
        inputs.wait_blocked()  # idle from the start
        assert holder[0].steps == 0
        client.add_request(make_request("a", 4))
        collect(client, {"a"})
        # Idle again: the loop waits for its next input without a timeout (no polling), after
        # the request's steps and at most one more (reporting the finished id).
        inputs.wait_blocked()
        assert 4 <= holder[0].steps <= 5
        assert inputs.timeouts and set(inputs.timeouts) == {None}
        # A new request wakes it up at once.
        client.add_request(make_request("b", 2))
        assert len(collect(client, {"b"}, timeout=10)["b"]) == 2
    finally:
        client.shutdown()


def test_abort_is_applied_before_the_next_update(args: EngineArgs) -> None:
    client = InprocEngineCoreClient(lambda: InstrumentedCore(args))
    try:
        # Hold the loop inside a utility call while an ADD and its ABORT are queued: both are
        # drained before the next step, so the request never yields a token.
        entered, release = threading.Event(), threading.Event()
        holder = threading.Thread(target=client.call_utility, args=("hold", entered, release))
        holder.start()
        assert entered.wait(10)
        client.add_request(make_request("never", 50))
        client.abort_requests(["never"])
        client.add_request(make_request("other", 3))
        release.set()
        holder.join(10)
        tokens = collect(client, {"other"})
        assert "never" not in tokens
        # Aborting a running request stops it at once, and is idempotent.
        client.add_request(make_request("long", 200))
        got = 0
        while got < 3:
            outs = client.get_output(timeout=10)
            got += sum(len(o.new_token_ids) for o in outs.outputs if o.request_id == "long")
        client.abort_requests(["long"])
        client.abort_requests(["long", "unknown-id"])
        stats = client.call_utility("make_stats")
        assert stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0
        num_kv_blocks = client.call_utility("num_kv_blocks")
        assert client.call_utility("num_free_kv_blocks") == num_kv_blocks - 1
    finally:
        client.shutdown()


def test_utility_calls_run_between_steps(args: EngineArgs) -> None:
    client = InprocEngineCoreClient(lambda: EngineCore(args))
    try:
        assert client.call_utility("max_model_len") == 256
        free = client.call_utility("num_free_kv_blocks")
        client.add_request(make_request("a", 30))
        client.get_output(timeout=10)
        assert client.call_utility("num_free_kv_blocks") < free
        with pytest.raises(AttributeError):
            client.call_utility("no_such_method")

        async def from_asyncio() -> Any:
            return await client.call_utility_async("make_stats")

        stats = asyncio.run(from_asyncio())
        assert stats.num_running_reqs + stats.num_waiting_reqs <= 1
        assert client.proc.is_alive
    finally:
        client.shutdown()


def test_crash_reaches_every_waiter_as_engine_dead(args: EngineArgs) -> None:
    holder: list[InstrumentedCore] = []
    client = InprocEngineCoreClient(
        lambda: holder.append(InstrumentedCore(args, fail_at_step=3)) or holder[-1]
    )
    try:
        client.add_request(make_request("a", 50))
        with pytest.raises(EngineDeadError) as info:
            collect(client, {"a"}, timeout=10)
        assert "injected engine failure" in str(info.value)
        assert client.errored
        client.proc.thread.join(5)
        assert not client.proc.thread.is_alive()
        assert holder[0].shut_down
        # Everything after death fails fast instead of hanging.
        with pytest.raises(EngineDeadError):
            client.get_output(timeout=1)
        with pytest.raises(EngineDeadError):
            client.add_request(make_request("b"))
        with pytest.raises(EngineDeadError):
            client.call_utility("make_stats")
        client.abort_requests(["a"])  # cleanup paths never raise
    finally:
        client.shutdown()


def test_startup_error_is_raised_by_the_constructor() -> None:
    def broken() -> EngineCore:
        raise ValueError("bad engine configuration")

    with pytest.raises(ValueError, match="bad engine configuration"):
        EngineCoreProc(broken)


def test_shutdown_joins_the_thread_and_fails_pending_work(args: EngineArgs) -> None:
    holder: list[InstrumentedCore] = []
    client = InprocEngineCoreClient(lambda: holder.append(InstrumentedCore(args)) or holder[-1])
    client.add_request(make_request("a", 200))
    client.get_output(timeout=10)
    client.shutdown(timeout=10)
    assert not client.proc.thread.is_alive()
    assert holder[0].shut_down
    assert client.errored
    with pytest.raises(EngineDeadError):
        while True:  # drains what was produced before the stop, then reports it
            client.get_output(timeout=5)
    client.shutdown()  # idempotent


def test_shutdown_from_the_engine_thread_stops_it_without_joining_itself(args) -> None:
    """A front end's finalizer may run on the engine thread (a garbage collection there): the
    shutdown it asks for stops the loop instead of raising on a join of the thread itself."""
    procs: list[Any] = []

    class SelfStopping(EngineCore):
        def stop_from_inside(self) -> bool:
            procs[0].shutdown(timeout=10)
            return True

    client = InprocEngineCoreClient(lambda: SelfStopping(args))
    procs.append(client.proc)
    try:
        assert client.call_utility("stop_from_inside") is True
        client.proc.thread.join(10)
        assert not client.proc.thread.is_alive()
    finally:
        client.shutdown()


def test_output_queue_wakes_an_asyncio_consumer_from_another_thread() -> None:
    q = OutputQueue()

    async def consume() -> list[Any]:
        got = []
        for _ in range(3):
            got.append(await asyncio.wait_for(q.get_async(), timeout=30))
        return got

    def waiting() -> bool:
        with q._cond:
            return q._waiter is not None

    def produce() -> None:
        for i in range(3):
            # Each put finds the consumer already waiting: the wake-up path, every time.
            deadline = time.monotonic() + 30
            while not waiting():
                assert time.monotonic() < deadline, "the consumer never waited"
                time.sleep(0.001)
            q.put(EngineCoreOutputs(finished_requests={str(i)}))

    t = threading.Thread(target=produce)
    t.start()
    got = asyncio.run(consume())
    t.join()
    assert [next(iter(o.finished_requests)) for o in got] == ["0", "1", "2"]
    with pytest.raises(queue.Empty):
        q.get(timeout=0)
