"""The engine core in a process of its own: the same tokens as the thread, aborts, utility
calls and their errors, start-up errors, and a dead core process failing its consumers."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import signal
from pathlib import Path

import httpx
import pytest

from cadence.core_types import EngineCoreOutputs
from cadence.engine.async_llm import AsyncLLM
from cadence.engine.core_client import EngineDeadError
from cadence.engine.core_process import CoreChannel, ProcessEngineCoreClient
from cadence.sampling_params import RequestOutputKind, SamplingParams
from tests.server.waiting import ServeProcess
from tests.tiny import tiny_args

PROMPTS = [[72, 101, 278, 111, 295], [84, 104, 101, 32, 113, 117], [65, 32, 115, 109, 97]]
ARGS = dict(max_model_len=128, num_gpu_blocks_override=64, async_scheduling=True)


def _params(max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          output_kind=RequestOutputKind.DELTA)


async def _tokens(engine: AsyncLLM, rid: str, prompt: list[int], max_tokens: int = 8) -> list[int]:
    ids: list[int] = []
    async for out in engine.generate({"prompt_token_ids": prompt}, _params(max_tokens), rid):
        ids.extend(out.outputs[0].token_ids)
    return ids


def test_process_core_equals_thread_core_and_serves_on() -> None:
    async def run(engine_process: bool) -> tuple[list[list[int]], list[int]]:
        engine = AsyncLLM(tiny_args(engine_process=engine_process, **ARGS))
        try:
            tokens = list(await asyncio.gather(
                *(_tokens(engine, f"r{i}", p) for i, p in enumerate(PROMPTS))))
            # An abort in the middle of a long request: a final "abort" output, blocks freed.
            outs = []
            async for out in engine.generate({"prompt_token_ids": PROMPTS[0]}, _params(100),
                                             "long"):
                outs.append(out)
                if len(outs) == 3:
                    await engine.abort("long")
            assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
            free = await engine.get_num_free_kv_blocks()
            stats = await engine.get_scheduler_stats()
            assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
            with pytest.raises(AttributeError):
                await engine.call_utility("no_such_method")
            assert engine.num_kv_blocks == 64 and engine.max_model_len == 128
            return tokens, [free]
        finally:
            engine.shutdown()

    thread = asyncio.run(run(False))
    process = asyncio.run(run(True))
    assert process == thread
    assert process[1] == [63]  # every usable block free again


def test_a_dead_core_process_fails_its_consumers() -> None:
    async def main() -> None:
        # A request far longer than the moment between its first output and the kill.
        engine = AsyncLLM(tiny_args(engine_process=True, max_model_len=2048,
                                    num_gpu_blocks_override=160))
        try:
            proc = engine.engine_core.process  # type: ignore[attr-defined]
            gen = engine.generate({"prompt_token_ids": PROMPTS[1]}, _params(2000), "doomed")
            await gen.__anext__()
            os.kill(proc.pid, signal.SIGKILL)
            with pytest.raises(EngineDeadError):
                async for _ in gen:
                    pass
            assert engine.errored
            with pytest.raises(EngineDeadError):
                await _tokens(engine, "late", PROMPTS[0])
        finally:
            engine.shutdown()

    asyncio.run(main())


def test_start_up_errors_reach_the_caller(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model"):
        AsyncLLM(tiny_args(engine_process=True, model=str(tmp_path / "missing")))


def test_cadence_serve_with_an_engine_process(tmp_path: Path) -> None:
    args = ["tiny", "--engine-process", "--max-model-len", "128", "--num-gpu-blocks-override",
            "64"]
    with ServeProcess(args, tmp_path / "serve.log") as srv:
        body = {"prompt": PROMPTS[0], "max_tokens": 5, "ignore_eos": True, "temperature": 0}
        resp = httpx.post(srv.base + "/v1/completions", json=body, timeout=30)
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 5
        metrics = httpx.get(srv.base + "/metrics", timeout=30).text
        assert "cadence:num_requests_running" in metrics
    assert srv.returncode == 0, srv.text
    assert "Traceback" not in srv.text


def test_the_client_fails_pending_calls_and_every_reader_when_the_core_is_gone() -> None:
    # The client over plain pipes (no core process): what the core's end sends, then EOF.
    req_recv, req_send = multiprocessing.Pipe(duplex=False)
    rep_recv, rep_send = multiprocessing.Pipe(duplex=False)
    client = ProcessEngineCoreClient(CoreChannel(req_send, rep_recv), None)  # type: ignore[arg-type]
    try:
        answered = client._submit_utility("max_model_len", (), {})
        failed = client._submit_utility("no_such_method", (), {})
        unreadable = client._submit_utility("collective_rpc_encoded", (b"",), {})
        pending = client._submit_utility("make_stats", (), {})
        calls = [req_recv.recv() for _ in range(4)]
        assert [c[:3] for c in calls] == [("utility", 0, "max_model_len"),
                                          ("utility", 1, "no_such_method"),
                                          ("utility", 2, "collective_rpc_encoded"),
                                          ("utility", 3, "make_stats")]
        rep_send.send(("reply", 0, True, pickle.dumps(128)))
        rep_send.send(("reply", 1, False, pickle.dumps(AttributeError("no_such_method"))))
        # A reply this process cannot rebuild fails its call alone; the reader reads on.
        rep_send.send(("reply", 2, True, b"not a pickle"))
        rep_send.send(("out", EngineCoreOutputs(finished_requests={"r"})))
        assert answered.result(timeout=30) == 128
        with pytest.raises(AttributeError):
            failed.result(timeout=30)
        with pytest.raises(RuntimeError, match="cannot be rebuilt here"):
            unreadable.result(timeout=30)
        assert client.get_output(timeout=30).finished_requests == {"r"}
        rep_send.close()  # the core process is gone before it answered the last call
        with pytest.raises(EngineDeadError):
            pending.result(timeout=30)
        for _ in range(2):  # every reader, not only the first, learns of the death
            with pytest.raises(EngineDeadError):
                client.get_output(timeout=30)
        assert client.errored
        with pytest.raises(EngineDeadError):
            client.call_utility("make_stats")
        client.abort_requests(["r"])  # cleanup paths never raise
    finally:
        client.shutdown()


def test_a_reply_to_a_call_given_up_meanwhile_leaves_the_reader_serving() -> None:
    """A caller's bounded wait (a /metrics scrape) may cancel a call's future just as its reply
    arrives, between the reader's check and its set: the reader thread lives on and delivers
    what comes next (it died of InvalidStateError, and that front end heard no more steps)."""
    from concurrent.futures import Future

    class CancelledInTheWindow(Future):
        def done(self) -> bool:  # the reader's check sees it pending; the cancel comes after
            return False

    req_recv, req_send = multiprocessing.Pipe(duplex=False)
    rep_recv, rep_send = multiprocessing.Pipe(duplex=False)
    client = ProcessEngineCoreClient(CoreChannel(req_send, rep_recv), None)  # type: ignore[arg-type]
    try:
        given_up = CancelledInTheWindow()
        assert given_up.cancel()
        client._calls[99] = given_up
        rep_send.send(("reply", 99, True, pickle.dumps(1)))
        rep_send.send(("reply", 99, False, pickle.dumps(AttributeError("late"))))  # (unknown by now)
        answered = client._submit_utility("max_model_len", (), {})
        call_id = req_recv.recv()[1]
        rep_send.send(("reply", call_id, True, pickle.dumps(128)))
        rep_send.send(("out", EngineCoreOutputs(finished_requests={"r"})))
        assert answered.result(timeout=30) == 128
        assert client.get_output(timeout=30).finished_requests == {"r"}
        assert not client.errored
    finally:
        client.shutdown()
