"""One tensor-parallel rank: a process holding its shard of the model and a ModelRunner on its
own device, executing every step the engine broadcasts.

Started by :mod:`cadence.worker.tp_executor` as ``python -c`` with its end of a socket pair as a
file descriptor (no multiprocessing machinery, so nothing but the workers is left behind). It
inherits the engine's environment unchanged (NCCL_* and friends). Messages, all pickled:

- ``("call", method, args)``: a start-up or shutdown call on the runner; every rank replies
  ``("ok", result)``.
- ``("step", scheduler_output)``: execute it; no reply. Rank 0 keeps each step's pending output
  until the engine asks for it; the other ranks drop theirs once the next step is launched.
- ``("fetch",)``: rank 0 replies ``("ok", ModelRunnerOutput)`` of its oldest pending step.
- ``("stop",)``: free the runner and the custom all-reduce's buffers, reply ``("ok", None)``,
  then exit at once (a process-group teardown can hang).

Any exception is sent as ``("error", exc)`` and ends the process with status 1. The engine's
end closing (EOF) also ends it, and so does the end of the engine's process (a pidfd watch).
"""

from __future__ import annotations

import collections
import logging
import os
import pickle
import select
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from cadence.user_errors import USER_ERRORS

if TYPE_CHECKING:
    from cadence.config import EngineConfig
    from cadence.model.registry import ModelSpec
    from cadence.runner_output import AsyncModelRunnerOutput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerInit:
    """The first message a worker receives."""

    rank: int
    size: int
    init_method: str  # torch.distributed rendezvous, e.g. tcp://127.0.0.1:PORT
    config: EngineConfig
    spec: ModelSpec
    seed: int
    cpu_threads: int


def main(fd: int) -> None:
    """Entry point of the worker process (``fd``: its end of the socket pair)."""
    # NOTE: a terminal's Ctrl-C reaches the whole process group; the engine decides when the
    # ranks stop (a stop message, or its own exit, which _exit_with_parent sees).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a SIGTERM to the group as well
    _exit_with_parent()
    conn = Connection(fd)
    try:
        init: WorkerInit = conn.recv()
    except EOFError:
        os._exit(0)
    from cadence.envs import read_envs

    logging.basicConfig(level=read_envs().logging_level,
                        format=f"%(asctime)s tp{init.rank} %(levelname)s %(name)s: %(message)s")
    try:
        runner = _start(init)
        # What the engine's model of shapes cannot know without touching a GPU itself.
        conn.send(("ok", {"fp8": _has_fp8(runner.model)}))
        _serve(conn, init.rank, runner)
    except EOFError:  # the engine is gone
        os._exit(0)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the engine
        # A user mistake (a directory without weights) is the engine's one-line error; its
        # traceback from every rank would bury that line (cadence.user_errors' rule).
        level = logging.DEBUG if isinstance(exc, USER_ERRORS) else logging.ERROR
        logger.log(level, "Tensor-parallel rank %d failed:\n%s", init.rank,
                   traceback.format_exc())
        try:
            conn.send(("error", _picklable(exc)))
        except Exception:
            pass
        os._exit(1)


def _exit_with_parent() -> None:
    """End this process as soon as the engine's process ends, whatever this one is doing (a
    collective whose peer is gone never returns)."""
    try:
        fd = os.pidfd_open(os.getppid())
    except (AttributeError, OSError):  # pragma: no cover - not Linux, or the parent is gone
        return

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll()
        os._exit(1)

    threading.Thread(target=watch, name="cadence-tp-parent", daemon=True).start()


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives a round trip through pickle (some exceptions pickle but cannot be
    rebuilt), else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _start(init: WorkerInit) -> Any:
    import torch
    import torch.distributed as dist

    from cadence.model.attention_backend import make_attention_backend
    from cadence.model.loader import build_model
    from cadence.worker.model_runner import ModelRunner

    cfg = init.config
    if cfg.device == "cuda":
        torch.cuda.set_device(init.rank)
        device = torch.device("cuda", init.rank)
        backend = "nccl"
    else:
        torch.set_num_threads(init.cpu_threads)
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend, init_method=init.init_method, rank=init.rank,
                            world_size=init.size,
                            device_id=device if backend == "nccl" else None)
    if backend == "nccl":
        from cadence.model.parallel import setup_custom_all_reduce

        setup_custom_all_reduce(device)  # collective: NCCL does every all-reduce where it can't
    torch.manual_seed(init.seed)  # the same on every rank: unseeded sampling agrees
    dtype = getattr(torch, cfg.dtype)
    backend = make_attention_backend(cfg.device)
    model = build_model(init.spec, dtype, device, cfg.model.load_format, backend, init.seed,
                        init.rank, init.size, quantization=cfg.model.quantization)
    return ModelRunner(cfg, init.spec, model, dtype, device, rank=init.rank)


def _has_fp8(model: Any) -> bool:
    from cadence.model.fp8 import Fp8Linear

    return any(isinstance(m, Fp8Linear) for m in model.modules())


def _serve(conn: Connection, rank: int, runner: Any) -> None:
    from cadence.envs import read_envs
    from cadence.torch_profiler import TorchProfiler

    pending: collections.deque[AsyncModelRunnerOutput] = collections.deque()
    envs = read_envs()
    profiler = TorchProfiler(envs.torch_profiler_dir,
                             getattr(runner.device, "type", None) == "cuda", rank,
                             envs.torch_profiler_options)
    while True:
        msg = pickle.loads(conn.recv_bytes())
        kind = msg[0]
        if kind == "step":
            pending.append(runner.execute_model(msg[1]))
            if rank != 0:
                # Only rank 0's tokens go back; the others free the older step's copy slot
                # (its copy finishes before the step just launched does).
                while len(pending) > 1:
                    pending.popleft().get_output()
        elif kind == "prefetch":  # a grammar to compile on this rank's compiler thread
            runner.prefetch_grammar(msg[1])
        elif kind == "fetch":
            conn.send(("ok", pending.popleft().get_output()))
        elif kind == "call":
            _, method, args = msg
            result = getattr(runner, method)(*args)
            conn.send(("ok", runner.capture_seconds if method == "capture_graphs" else result))
        elif kind == "rpc":  # collective_rpc: a failure goes back as a reply, the rank serves on
            conn.send(("ok", _rpc(runner, msg[1])))
        elif kind == "profile":  # a refusal goes back as a reply: the rank stays in service
            _, is_start, prefix = msg
            try:
                result = profiler.start(prefix) if is_start else profiler.stop()
            except (RuntimeError, ValueError, OSError) as exc:
                conn.send(("ok", (False, str(exc))))
            else:
                conn.send(("ok", (True, result)))
        elif kind == "stop":
            from cadence.model.parallel import close_custom_all_reduce

            profiler.close()
            runner.close()
            close_custom_all_reduce()  # every rank gets "stop"
            conn.send(("ok", None))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        else:
            raise ValueError(f"unknown message {kind!r}")


def _rpc(runner: Any, payload: bytes) -> tuple[bool, Any]:
    """(True, the pickled result) of one collective_rpc call, or (False, why it failed): the
    call and its result pickled apart from the messages (a tensor goes by value, not by a file
    descriptor), so that neither can fail the rank or the engine."""
    from cadence.worker.worker_rpc import decode_call, encode_result, run_on_worker

    try:
        return True, encode_result(run_on_worker(runner, *decode_call(payload)))
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
