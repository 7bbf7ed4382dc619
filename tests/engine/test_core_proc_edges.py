"""EngineCoreProc and the in-process client at their edges: a request the core refuses, an abort
that yields no token, utility calls queued behind a shutdown or a fatal error, utility calls that
race the thread's death, and the progress time the server's watchdog reads."""

from __future__ import annotations

import threading
import time
from concurrent.futures import TimeoutError as FutureTimeoutError

import pytest

from cadence.core_types import EngineCoreOutputs, EngineCoreRequest, FinishReason
from cadence.engine.core import EngineCore
from cadence.engine.core_client import EngineDeadError, InprocEngineCoreClient
from cadence.engine.core_proc import RequestType
from cadence.engine.engine_args import EngineArgs
from cadence.sampling_params import SamplingParams
from tests.gated_core import GatedCore
from tests.tiny import tiny_args

PROMPT = [72, 101, 278, 111, 295, 121, 290, 346]
# Only bounds that turn a hang (the bug) into a failure; the passing paths never wait on them.
WAIT_S = 30.0


@pytest.fixture(scope="module")
def args() -> EngineArgs:
    return tiny_args(max_model_len=256, num_gpu_blocks_override=128)


def make_request(rid: str, max_tokens: int = 4, priority: int = 0) -> EngineCoreRequest:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    return EngineCoreRequest(rid, list(PROMPT), params, eos_token_id=None, priority=priority)


class HoldingCore(EngineCore):
    """The real core with a utility that keeps the loop busy until the test releases it."""

    def hold(self, entered: threading.Event, release: threading.Event) -> None:
        entered.set()
        assert release.wait(WAIT_S)


def hold_loop(client: InprocEngineCoreClient) -> tuple[threading.Thread, threading.Event]:
    """Park the engine loop inside a utility call; set the returned event to let it go on."""
    entered, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: client.call_utility("hold", entered, release))
    thread.start()
    assert entered.wait(WAIT_S)
    return thread, release


def outputs_until_finished(client: InprocEngineCoreClient, rid: str) -> list[EngineCoreOutputs]:
    got = []
    while True:
        outs = client.get_output(timeout=WAIT_S)
        got.append(outs)
        if rid in outs.finished_requests:
            return got


def test_a_request_the_core_refuses_fails_alone(args: EngineArgs) -> None:
    # More tokens than the whole KV cache holds (127 usable blocks of 16): the core refuses
    # it. That request ends with an error output naming the cause (nobody waits for it
    # forever); the engine serves on.
    client = InprocEngineCoreClient(lambda: EngineCore(args))
    try:
        client.add_request(make_request("refused", max_tokens=127 * 16))
        outs = client.get_output(timeout=WAIT_S)
        assert outs.finished_requests == {"refused"}
        [out] = outs.outputs
        assert out.request_id == "refused" and out.finish_reason == FinishReason.ERROR
        assert out.new_token_ids == [] and "max_tokens" in (out.error or "")
        client.add_request(make_request("fine", max_tokens=3))
        tokens = [t for o in outputs_until_finished(client, "fine") for x in o.outputs
                  for t in x.new_token_ids]
        assert len(tokens) == 3 and not client.errored
    finally:
        client.shutdown()


def test_an_abort_reports_the_finished_id_in_an_output_without_tokens(args: EngineArgs) -> None:
    # The front end waits for the finished id of an aborted request before a new request may
    # reuse the id. An abort that comes while a step is under way (here: at its gate, its
    # inputs already drained) is applied before that step's update (vLLM): the step schedules
    # "x" but reports only its finished id, no token.
    client = InprocEngineCoreClient(lambda: GatedCore(args))
    core: GatedCore = client.proc.engine_core  # type: ignore[assignment]
    try:
        client.add_request(make_request("x", max_tokens=100))
        core.allow()
        assert [len(o.new_token_ids) for o in client.get_output(timeout=WAIT_S).outputs] == [1]
        core.wait_at_gate(steps=1)  # step 2 waits at the gate: "x" is scheduled in it
        client.abort_requests(["x"])
        core.allow()
        second = client.get_output(timeout=WAIT_S)
        assert second.outputs == [] and second.finished_requests == {"x"}
        assert core.tokens.get("x") == 1
    finally:
        core.open()
        client.shutdown()


def test_shutdown_fails_the_utility_calls_queued_behind_it(args: EngineArgs) -> None:
    client = InprocEngineCoreClient(lambda: HoldingCore(args))
    try:
        holder, release = hold_loop(client)
        client.proc.send(RequestType.SHUTDOWN)
        late = client._submit_utility("make_stats", (), {})  # queued after the shutdown
        release.set()
        holder.join(WAIT_S)
        with pytest.raises(EngineDeadError, match="shut down"):
            late.result(timeout=WAIT_S)
    finally:
        client.shutdown()


def test_a_fatal_error_fails_queued_calls_and_reaches_readers_with_its_cause(
    args: EngineArgs,
) -> None:
    # A tensor-parallel worker that exits reports FATAL: the loop dies with that error.
    client = InprocEngineCoreClient(lambda: HoldingCore(args))
    try:
        holder, release = hold_loop(client)
        client.proc.send(RequestType.FATAL, RuntimeError("worker rank 1 exited"))
        late = client._submit_utility("make_stats", (), {})
        release.set()
        holder.join(WAIT_S)
        with pytest.raises(EngineDeadError):
            late.result(timeout=WAIT_S)
        with pytest.raises(EngineDeadError, match="worker rank 1 exited"):
            client.get_output(timeout=WAIT_S)
        assert client.errored and isinstance(client.proc.error, RuntimeError)
    finally:
        client.shutdown()


def test_a_utility_call_that_races_the_threads_death_fails(
    args: EngineArgs, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client's liveness check can pass just before the thread dies and drains its queue;
    # the call put after that must still fail rather than wait forever.
    client = InprocEngineCoreClient(lambda: HoldingCore(args))
    client.shutdown()
    assert not client.proc.thread.is_alive()
    monkeypatch.setattr(client, "_check_alive", lambda: None)  # the check that passed in time
    fut = client._submit_utility("make_stats", (), {})
    try:
        fut.result(timeout=WAIT_S)
    except FutureTimeoutError:
        pytest.fail("the call was never answered")
    except EngineDeadError:
        pass
    else:
        pytest.fail("a dead engine answered a utility call")


def test_every_completed_step_counts_as_progress(args: EngineArgs) -> None:
    # The watchdog compares last_progress_time with the clock while requests are unfinished:
    # each completed step must move it, not only waking up to new work.
    client = InprocEngineCoreClient(lambda: GatedCore(args))
    core: GatedCore = client.proc.engine_core  # type: ignore[assignment]
    try:
        client.add_request(make_request("x", max_tokens=50))
        core.allow()
        core.wait_at_gate(steps=1)
        before = time.monotonic()
        assert client.last_progress_time <= before
        core.allow()
        core.wait_at_gate(steps=2)  # step 2 completed: the loop is at the gate of step 3
        assert client.last_progress_time >= before
    finally:
        core.open()
        client.shutdown()



def test_waking_up_to_new_work_counts_as_progress(args: EngineArgs) -> None:
    """The stall watchdog's clock restarts when the idle loop wakes up with new inputs: while
    the first step after an idle spell runs, the time since progress is that step's alone,
    not the idle spell's (/health would otherwise report a stall after a quiet minute)."""
    import time

    client = InprocEngineCoreClient(lambda: GatedCore(args))
    core: GatedCore = client.proc.engine_core  # type: ignore[assignment]
    try:
        core.wait_idle()
        before_add = time.monotonic()
        client.add_request(make_request("x", max_tokens=2))
        core.wait_at_gate(steps=0)  # woken up, the inputs handled, the first step at its gate
        assert client.proc.last_progress_time >= before_add
    finally:
        core.open()
        client.shutdown()
