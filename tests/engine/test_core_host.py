"""The engine-core process's routing of requests and outputs among its front ends, and the
utility replies it sends them (``cadence.engine.core_host``), without a process: fake pipes."""

from __future__ import annotations

import pickle
from concurrent.futures import Future
from typing import Any

import pytest

from cadence.core_types import EngineCoreOutput, EngineCoreOutputs, FinishReason
from cadence.engine.core_host import (
    CoreFacts,
    HostChannel,
    _Front,
    _refused,
    _Router,
    picklable,
    reply_payload,
)


class _Pipe:
    """The reply end of a front end's pipe: keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def send(self, message: tuple[Any, ...]) -> None:
        self.sent.append(message)


def _router(n: int) -> tuple[_Router, list[_Pipe]]:
    pipes = [_Pipe() for _ in range(n)]
    fronts = [_Front(HostChannel(None, pipe)) for pipe in pipes]  # type: ignore[arg-type]
    return _Router(fronts), pipes


def _step(*tokens: tuple[str, int], finished: set[str] | None = None) -> EngineCoreOutputs:
    return EngineCoreOutputs([EngineCoreOutput(rid, [tok]) for rid, tok in tokens],
                             finished_requests=finished or set())


def test_one_front_end_may_reuse_the_id_of_a_finished_request() -> None:
    router, (pipe,) = _router(1)
    assert router.add(0, "a")
    assert not router.add(0, "a")  # still running: refused
    router.deliver(_step(("a", 5), finished={"a"}))
    assert pipe.sent[-1][0] == "out" and pipe.sent[-1][1].finished_requests == {"a"}
    assert router.add(0, "a")  # finished: its id is free again


def test_an_id_live_on_another_front_end_is_refused() -> None:
    router, _ = _router(2)
    assert router.add(0, "x")
    assert not router.add(1, "x")
    assert router.owner == {"x": 0}


def test_a_front_end_aborts_only_its_own_requests() -> None:
    router, _ = _router(2)
    router.add(0, "x")
    router.add(1, "y")
    assert router.release(1, ["x", "y"]) == ["y"]  # x is front end 0's: left running
    assert router.owner == {"x": 0}
    assert router.release(0, ["x"]) == ["x"]
    assert router.owner == {}


def test_each_front_end_hears_its_own_outputs_and_finishes() -> None:
    router, (p0, p1, p2) = _router(3)
    router.add(0, "a")
    router.add(1, "b")
    router.add(1, "c")
    router.deliver(_step(("a", 1), ("b", 2), finished={"b"}))
    (kind0, out0), (kind1, out1) = p0.sent[-1], p1.sent[-1]
    assert kind0 == kind1 == "out"
    assert [(o.request_id, o.new_token_ids) for o in out0.outputs] == [("a", [1])]
    assert [(o.request_id, o.new_token_ids) for o in out1.outputs] == [("b", [2])]
    assert (out0.finished_requests, out1.finished_requests) == (set(), {"b"})
    assert p2.sent == []  # no requests, not front end 0: nothing to hear
    # A step without tokens for front end 1 still reaches it (its stall watchdog counts
    # steps) while its request c is live; front end 0 hears every step (engine metrics).
    router.deliver(_step(("a", 3)))
    assert len(p1.sent) == 2 and p1.sent[-1][1].outputs == []
    assert [o.request_id for o in p0.sent[-1][1].outputs] == ["a"]
    router.deliver(_step(("a", 4), finished={"a"}))
    router.release(1, ["c"])
    sent = [len(p.sent) for p in (p0, p1, p2)]
    router.deliver(_step())
    assert [len(p.sent) for p in (p0, p1, p2)] == [sent[0] + 1, sent[1], sent[2]]


def test_a_refused_duplicate_finishes_with_an_error_naming_the_id() -> None:
    out = _refused("r7")
    assert out.finished_requests == {"r7"}
    (only,) = out.outputs
    assert (only.request_id, only.new_token_ids) == ("r7", [])
    assert only.finish_reason == FinishReason.ERROR
    assert only.error is not None and "r7" in only.error and "already running" in only.error


class _TwoArgError(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code}: {text}")


def test_exceptions_that_cannot_be_rebuilt_travel_as_their_text() -> None:
    plain = ValueError("bad")
    assert picklable(plain) is plain
    odd = _TwoArgError(3, "odd")
    sent = picklable(odd)
    assert type(sent) is RuntimeError and "odd" in str(sent)
    assert str(pickle.loads(pickle.dumps(sent))) == str(sent)


def test_a_utility_reply_carries_its_result_or_its_failure() -> None:
    done: Future[Any] = Future()
    done.set_result({"max_model_len": 128})
    ok, data = reply_payload(done)
    assert ok and pickle.loads(data) == {"max_model_len": 128}

    failed: Future[Any] = Future()
    failed.set_exception(KeyError("nope"))
    ok, data = reply_payload(failed)
    assert not ok and isinstance(pickle.loads(data), KeyError)

    unpicklable: Future[Any] = Future()
    unpicklable.set_result(lambda: None)  # a result pickle cannot send fails this call alone
    ok, data = reply_payload(unpicklable)
    error = pickle.loads(data)
    assert not ok and isinstance(error, RuntimeError) and "cannot be sent" in str(error)


def test_core_facts_read_the_cores_sizes() -> None:
    class Core:
        spec, config = "spec", "config"
        max_model_len, vocab_size, num_kv_blocks, block_size = 256, 1000, 64, 16

    facts = CoreFacts.of(Core())
    assert (facts.max_model_len, facts.vocab_size) == (256, 1000)
    assert (facts.num_kv_blocks, facts.block_size) == (64, 16)


@pytest.mark.parametrize("gone", [OSError, ValueError])
def test_a_front_end_whose_pipe_broke_is_gone_and_sent_no_more(gone: type[Exception]) -> None:
    class Broken:
        calls = 0

        def send(self, message: tuple[Any, ...]) -> None:
            Broken.calls += 1
            raise gone("closed")

    front = _Front(HostChannel(None, Broken()))  # type: ignore[arg-type]
    front.send(("out", None))
    assert front.gone
    front.send(("out", None))
    assert Broken.calls == 1
