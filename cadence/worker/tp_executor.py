"""The engine's side of tensor parallelism: N worker processes (one per rank, see
:mod:`cadence.worker.tp_worker`) behind the ModelRunner interface the engine core drives.

Each step's ``SchedulerOutput`` is pickled once and written to every rank's socket; only rank 0
sends its sampled tokens back, when the engine asks for them (``get_output`` of the step's
pending output), so async scheduling keeps two steps in flight exactly as with one runner.

The engine never blocks where a dead worker could leave it waiting forever: every wait is on the
workers' sockets, which end (EOF) when a worker exits, and a monitor thread kills every worker as
soon as one exits unasked (the survivors would hang in their next collective) and reports the
death through ``set_failure_callback``, so an idle engine learns of it too.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from cadence.config import EngineConfig
from cadence.model.registry import ModelSpec
from cadence.runner_output import ModelRunnerOutput
from cadence.sampling_params import StructuredOutputsParams
from cadence.scheduler.output import SchedulerOutput
from cadence.worker.tp_worker import WorkerInit

logger = logging.getLogger(__name__)

_STOP_TIMEOUT_S = 10.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker process exited while the engine needed it."""


class TPExecutor:
    """Starts the ranks, relays the runner calls, and owns the processes until ``close``."""

    def __init__(self, config: EngineConfig, spec: ModelSpec, dtype: torch.dtype, seed: int,
                 cpu_threads: int) -> None:
        from cadence.model.attention import TorchAttentionBackend
        from cadence.model.decoder import CausalLM
        from cadence.model.dtypes import kv_cache_dtype
        from cadence.model.fp8 import quantize_model_fp8

        self.size = config.parallel.tensor_parallel_size
        self._tokenizer_path = spec.tokenizer_path
        self._grammars = None  # the engine side's grammar compiler, made on first use
        # The whole model's shapes, on no device (what benchmarks and traces read of a model).
        with torch.device("meta"):
            self.model = CausalLM(spec.hf_config, TorchAttentionBackend()).to(dtype)
        self.kv_dtype = kv_cache_dtype(config.cache.cache_dtype, dtype)  # the ranks' cache dtype
        self.graphs = self.mixed_graphs = None
        self.capture_seconds = 0.0
        self._closing = False
        self._dead: WorkerDiedError | None = None
        self._on_failure: Callable[[BaseException], None] | None = None
        self._lock = threading.Lock()
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []
        self._monitor: threading.Thread | None = None
        self._stop_r, self._stop_w = os.pipe()
        try:
            init_method = f"tcp://127.0.0.1:{_free_port()}"
            for _ in range(self.size):
                self._spawn()
            for rank, conn in enumerate(self.conns):
                conn.send(WorkerInit(rank, self.size, init_method, config, spec, seed,
                                     cpu_threads))
            started = self._collect(set(range(self.size)))
            # Quantized as the ranks' shards are (they decide: an FP8 checkpoint runs in FP8
            # only on FP8 GPUs), so that weight bytes count FP8 projections as one byte.
            if started[0]["fp8"]:
                quantize_model_fp8(self.model)
            self._monitor = threading.Thread(target=self._watch, name="cadence-tp-monitor",
                                             daemon=True)
            self._monitor.start()
        except BaseException:
            self.close()
            raise
        logger.info("Tensor parallelism: %d worker processes (pids %s) on %s.", self.size,
                    [p.pid for p in self.procs], config.device)

    # Processes -------------------------------------------------------------------------------
    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        fd = theirs.fileno()
        code = (f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); "
                f"from cadence.worker.tp_worker import main; main({fd})")
        try:
            # The environment passes through unchanged (NCCL_NVLS_ENABLE=0 and the like).
            proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(fd,))
        finally:
            theirs.close()
        self.procs.append(proc)
        self.conns.append(Connection(ours.detach()))

    def set_failure_callback(self, callback: Callable[[BaseException], None]) -> None:
        """``callback(error)`` runs (on the monitor thread) when a worker exits unasked."""
        self._on_failure = callback

    def _watch(self) -> None:
        fds = {os.pidfd_open(p.pid): rank for rank, p in enumerate(self.procs)}
        poller = select.poll()  # NOTE: not select.select, which refuses descriptors >= 1024
        for fd in (*fds, self._stop_r):
            poller.register(fd, select.POLLIN)
        try:
            ready = [fd for fd, _ in poller.poll()]
        finally:
            for fd in fds:
                os.close(fd)
        exited = [fds[fd] for fd in ready if fd in fds]
        if not exited or self._closing:
            return
        error = self._died(exited[0])
        callback = self._on_failure
        if callback is not None:
            callback(error)

    def _died(self, rank: int, reported: bool = False) -> WorkerDiedError:
        """Record the death of ``rank`` and kill every worker (idempotent); ``reported``: the
        rank sent its error, which the caller raises (no second line of it in the log)."""
        with self._lock:
            if self._dead is None:
                proc = self.procs[rank]
                try:
                    code = proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    code = None
                self._dead = WorkerDiedError(
                    f"tensor-parallel worker rank {rank} (pid {proc.pid}) exited with status "
                    f"{code}; the engine cannot continue.")
                logger.log(logging.DEBUG if reported else logging.ERROR, "%s", self._dead)
            self._kill_all()
            return self._dead

    def _kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            try:
                proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process SIGKILL misses
                logger.error("tensor-parallel worker pid %d did not exit after SIGKILL", proc.pid)

    # Messages --------------------------------------------------------------------------------
    def _send(self, data: bytes, ranks: range | list[int]) -> None:
        if self._dead is not None:
            raise self._dead
        for rank in ranks:
            try:
                self.conns[rank].send_bytes(data)
            except OSError:
                raise self._died(rank) from None

    def _collect(self, expect: set[int]) -> dict[int, Any]:
        """Wait for one reply from each rank in ``expect``; a reply, an error or an exit of any
        other rank meanwhile is a failure."""
        replies: dict[int, Any] = {}
        while len(replies) < len(expect):
            if self._dead is not None:
                raise self._dead
            for conn in wait(self.conns):
                rank = self.conns.index(conn)
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    raise self._died(rank) from None
                except Exception as exc:  # a reply that cannot be rebuilt: the rank is lost
                    raise self._died(rank) from exc
                if kind == "error":
                    self._died(rank, reported=True)
                    if not isinstance(payload, Exception):  # e.g. KeyboardInterrupt: not ours
                        raise WorkerDiedError(
                            f"tensor-parallel rank {rank} stopped: {payload!r}") from None
                    payload.add_note(f"(in tensor-parallel worker rank {rank})")
                    raise payload
                if rank not in expect or rank in replies:
                    self._died(rank)
                    raise WorkerDiedError(f"unexpected reply from tensor-parallel rank {rank}")
                replies[rank] = payload
        return replies

    def _call_all(self, method: str, *args: Any) -> list[Any]:
        return self._call_all_kind("call", method, args)

    def _call_all_kind(self, kind: str, *payload: Any) -> list[Any]:
        self._send(pickle.dumps((kind, *payload)), range(self.size))
        replies = self._collect(set(range(self.size)))
        return [replies[r] for r in range(self.size)]

    # The ModelRunner interface ---------------------------------------------------------------
    def determine_num_kv_blocks(self) -> int:
        return min(self._call_all("determine_num_kv_blocks"))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self._call_all("initialize_kv_cache", num_blocks)

    def capture_graphs(self) -> None:
        self.capture_seconds = max(self._call_all("capture_graphs"))

    def kernels_per_step(self, batch: int) -> int | None:
        return None

    def profile(self, is_start: bool, prefix: str | None) -> str | None:
        """Start or stop every rank's torch profiler (cadence.torch_profiler); rank 0's trace
        path at a stop. A rank's refusal is a RuntimeError here, not a lost rank."""
        results = self._call_all_kind("profile", is_start, prefix)
        for rank, (ok, value) in enumerate(results):
            if not ok:
                raise RuntimeError(f"tensor-parallel rank {rank}: {value}")
        return results[0][1]

    def collective_rpc(self, method: Any, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> list[Any]:
        """Run ``method`` on every rank (``worker_rpc.run_on_worker``); their results in rank
        order. A rank's failure is a RuntimeError naming it; the ranks stay in service."""
        from cadence.worker.worker_rpc import decode_result, encode_call

        results = self._call_all_kind("rpc", encode_call(method, args, kwargs))
        values = []
        for rank, (ok, value) in enumerate(results):
            if ok:
                try:
                    value = decode_result(value)
                except ValueError as exc:
                    ok, value = False, str(exc)
            if not ok:
                raise RuntimeError(f"collective_rpc: tensor-parallel rank {rank}: {value}")
            values.append(value)
        return values

    def prefetch_grammar(self, spec: StructuredOutputsParams) -> Future:
        """Have every rank start compiling ``spec`` on its compiler thread; the engine compiles
        it too, and its future gates the request (the ranks do the same work, so theirs are
        ready about as soon; a rank still compiling when the request arrives waits there)."""
        self._send(pickle.dumps(("prefetch", spec)), range(self.size))
        if self._grammars is None:
            from cadence.worker.grammar_compiler import GrammarCompilerService

            self._grammars = GrammarCompilerService(self._tokenizer_path)
        return self._grammars.submit(spec)

    def execute_model(self, so: SchedulerOutput) -> _PendingStep:
        self._send(encode_step(so), range(self.size))
        return _PendingStep(self)

    def fetch(self) -> ModelRunnerOutput:
        """Rank 0's output of the oldest step not fetched yet."""
        self._send(_FETCH, [0])
        return self._collect({0})[0]

    def close(self) -> None:
        """Stop the workers (asked, then killed past a deadline); idempotent."""
        if self._closing:
            return
        self._closing = True
        os.write(self._stop_w, b"x")
        if self._dead is None and all(p.poll() is None for p in self.procs):
            try:
                self._send(pickle.dumps(("stop",)), range(self.size))
                ready = set()
                while len(ready) < len(self.conns):
                    got = wait([c for c in self.conns if c not in ready], _STOP_TIMEOUT_S)
                    if not got:
                        break
                    ready.update(got)
            except Exception:  # a worker died meanwhile: the kill below ends the rest
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning("tensor-parallel worker pid %d did not stop; killing it", proc.pid)
        self._kill_all()
        for conn in self.conns:
            conn.close()
        if self._monitor is not None:
            self._monitor.join()
        os.close(self._stop_r)
        os.close(self._stop_w)
        if self._grammars is not None:
            self._grammars.close()


_FETCH = pickle.dumps(("fetch",))


def encode_step(so: SchedulerOutput) -> bytes:
    """A step's message to the workers (pickled once, written to every rank)."""
    return pickle.dumps(("step", so), protocol=pickle.HIGHEST_PROTOCOL)


class _PendingStep:
    """A step launched on every rank; ``get_output`` fetches rank 0's tokens."""

    __slots__ = ("executor",)

    def __init__(self, executor: TPExecutor) -> None:
        self.executor = executor

    def get_output(self) -> ModelRunnerOutput:
        return self.executor.fetch()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
