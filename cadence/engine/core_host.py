"""The engine-core process's side: one ``EngineCoreProc`` loop serving one or more front ends.

The process runs the core through an ``InprocEngineCoreClient`` of its own and talks to each
front end over a pair of pipes (a ``HostChannel``): requests, aborts and utility calls arrive;
step outputs, utility replies and the end of the engine leave. With several front ends (several
API server processes over one engine), each request's outputs go back to the front end that
added it; a step's outputs are split accordingly.

Messages (tuples, pickled by the pipes): to the core ``("add", request)``, ``("abort", ids)``,
``("utility", call_id, method, args, kwargs)``, ``("shutdown",)``; from the core
``("ready", facts)``, ``("startup_error", exc)``, ``("out", outputs)``,
``("reply", call_id, ok, pickled value)``, ``("dead", message)``.

A front end whose pipe closes is gone: its requests are aborted. The process ends when one front
end asks it to (``shutdown``, the single-front-end mode) or when every front end is gone.
"""

from __future__ import annotations

import pickle
import signal
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from cadence.config import EngineConfig
from cadence.core_types import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
)
from cadence.engine.core_proc import EngineDeadError
from cadence.engine.engine_args import EngineArgs
from cadence.engine.request_checks import check_request_fits
from cadence.model.registry import ModelSpec

__all__ = ["CoreFacts", "HostChannel", "host_main"]


@dataclass(frozen=True)
class CoreFacts:
    """What a front end reads of an engine core it cannot reach into (model, sizes)."""

    spec: ModelSpec
    config: EngineConfig
    max_model_len: int
    vocab_size: int
    num_kv_blocks: int
    block_size: int

    @classmethod
    def of(cls, core: Any) -> CoreFacts:
        return cls(core.spec, core.config, core.max_model_len, core.vocab_size,
                   core.num_kv_blocks, core.block_size)

    def validate_request(self, req: EngineCoreRequest) -> None:
        check_request_fits(req, self.num_kv_blocks, self.block_size)


@dataclass
class HostChannel:
    """The core's ends of one front end's pipes."""

    requests: Connection  # receives
    replies: Connection  # sends


def picklable(exc: BaseException) -> BaseException:
    """``exc``, or its text in a RuntimeError where it cannot make the trip: pickled, then
    rebuilt (an exception whose ``__init__`` takes other arguments than its ``args`` cannot)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(repr(exc))


def reply_payload(fut: Future[Any]) -> tuple[bool, bytes]:
    """A utility call's outcome for its front end, pickled apart from the pipe's message: a
    result that cannot be pickled fails that call alone (the front end likewise rebuilds it
    apart, ``ProcessEngineCoreClient._read``)."""
    exc = fut.exception()
    if exc is None:
        try:
            return True, pickle.dumps(fut.result())
        except Exception as err:  # pickle raises several kinds (RecursionError among them)
            exc = RuntimeError(f"the utility's result cannot be sent to the front end: {err!r}")
    return False, pickle.dumps(picklable(exc))


class _Front:
    """One front end as the core sees it: its reply pipe and the requests it owns."""

    def __init__(self, channel: HostChannel) -> None:
        self.channel = channel
        self.lock = threading.Lock()  # the output pump and utility replies both send
        self.live: set[str] = set()
        self.gone = False

    def send(self, message: tuple[Any, ...]) -> None:
        if self.gone:
            return
        try:
            with self.lock:
                self.channel.replies.send(message)
        except (OSError, ValueError):  # the front end went away
            self.gone = True


class _Router:
    """Which front end owns each live request; splits each step's outputs among them."""

    def __init__(self, fronts: list[_Front]) -> None:
        self.fronts = fronts
        self.owner: dict[str, int] = {}

    def add(self, index: int, request_id: str) -> bool:
        """Record front end ``index`` as the request's owner; False (nothing recorded) when a
        live request has that id already, on any front end."""
        if request_id in self.owner:
            return False
        self.owner[request_id] = index
        self.fronts[index].live.add(request_id)
        return True

    def release(self, index: int, request_ids: list[str]) -> list[str]:
        """Forget those of ``request_ids`` that front end ``index`` owns, and return them: a
        front end aborts only its own requests (its refused duplicate of another's id must not
        end the other's request)."""
        mine = [rid for rid in request_ids if self.owner.get(rid) == index]
        self.forget(mine)
        return mine

    def forget(self, request_ids: list[str] | set[str]) -> None:
        for rid in request_ids:
            index = self.owner.pop(rid, None)
            if index is not None:
                self.fronts[index].live.discard(rid)

    def deliver(self, outputs: EngineCoreOutputs) -> None:
        fronts = self.fronts
        if len(fronts) == 1:
            fronts[0].send(("out", outputs))
            self.forget(outputs.finished_requests)
            return
        parts: list[list[Any]] = [[] for _ in fronts]
        owner = self.owner
        for out in outputs.outputs:
            index = owner.get(out.request_id)
            if index is not None:
                parts[index].append(out)
        finished: list[set[str]] = [set() for _ in fronts]
        for rid in outputs.finished_requests:
            index = owner.get(rid)
            if index is not None:
                finished[index].add(rid)
        self.forget(outputs.finished_requests)
        for i, front in enumerate(fronts):
            # Every front end with requests in the core hears of every step (its stall watchdog
            # counts steps), even one in which none of its requests produced a token; front end
            # 0 hears of all of them (it records the engine-wide metrics).
            if parts[i] or finished[i] or front.live or i == 0:
                front.send(("out", EngineCoreOutputs(parts[i], outputs.scheduler_stats,
                                                     finished[i], outputs.timestamp)))


def _refused(request_id: str) -> EngineCoreOutputs:
    error = f"request_id: Request id {request_id} already running."
    out = EngineCoreOutput(request_id, [], finish_reason=FinishReason.ERROR, error=error)
    return EngineCoreOutputs([out], finished_requests={request_id})


def host_main(args: EngineArgs, channels: list[HostChannel]) -> None:
    """The engine core process: build the core, then serve the front ends until told to stop."""
    from cadence.engine.core import EngineCore
    from cadence.engine.core_client import InprocEngineCoreClient

    # The owner stops this process; a terminal's Ctrl-C (sent to the whole process group) must
    # not kill it under the front ends while they drain their requests.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # and a SIGTERM to the group (systemd's stop)
    fronts = [_Front(c) for c in channels]
    try:
        client = InprocEngineCoreClient(lambda: EngineCore(args))
    except BaseException as exc:
        for f in fronts:
            f.send(("startup_error", picklable(exc)))
        return
    facts = CoreFacts.of(client.proc.engine_core)
    for f in fronts:
        f.send(("ready", facts))
    router = _Router(fronts)

    def pump() -> None:  # step outputs, as the core makes them
        while True:
            try:
                outputs = client.get_output()
            except EngineDeadError as exc:
                for f in fronts:
                    f.send(("dead", str(exc)))
                return
            router.deliver(outputs)

    threading.Thread(target=pump, name="cadence-core-outputs", daemon=True).start()

    def reply(front: _Front, call_id: int, fut: Future[Any]) -> None:
        front.send(("reply", call_id, *reply_payload(fut)))

    by_conn = {f.channel.requests: (i, f) for i, f in enumerate(fronts)}
    open_conns = list(by_conn)
    stop = False
    while open_conns and not stop:
        for conn in wait(open_conns):
            index, front = by_conn[conn]  # type: ignore[index]
            try:
                message = conn.recv()  # type: ignore[union-attr]
            except (EOFError, OSError):  # this front end is gone: nobody reads its requests
                front.gone = True
                open_conns.remove(conn)
                orphans = list(front.live)
                router.forget(orphans)
                if orphans:
                    client.abort_requests(orphans)
                continue
            kind = message[0]
            try:
                if kind == "add":
                    rid = message[1].request_id
                    if router.add(index, rid):
                        client.add_request(message[1])
                    else:  # another front end's request has this id: this one fails alone
                        front.send(("out", _refused(rid)))
                elif kind == "abort":
                    mine = router.release(index, message[1])
                    if mine:
                        client.abort_requests(mine)
                elif kind == "utility":
                    call_id, method, a, kw = message[1:]
                    fut = client._submit_utility(method, a, kw)
                    fut.add_done_callback(
                        lambda f, front=front, call_id=call_id: reply(front, call_id, f)
                    )
                elif kind == "shutdown":
                    stop = True
                    break
            except EngineDeadError:
                continue  # the pump reports the death
    client.shutdown()
