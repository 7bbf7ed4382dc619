"""Host cost of the tensor-parallel channel per decode step: the engine pickling a step's
``SchedulerOutput`` once and writing it to every rank's socket, then asking rank 0 for its
tokens and reading them back.

    python scripts/tp_channel_bench.py [--batch 64] [--ranks 2] [--steps 2000]

The ranks here are stand-in processes that read each message (and unpickle it, as a worker
does); rank 0 answers each fetch with a ``ModelRunnerOutput`` of ``--batch`` rows. Prints
microseconds per step: the engine's send (pickle + writes, the figure to keep <= 50 us at batch
64), the fetch round trip, and a rank's unpickling of the step.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import pickle
import statistics
import sys
import time
import uuid
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadence.runner_output import ModelRunnerOutput  # noqa: E402
from cadence.scheduler.output import CachedRequestData, SchedulerOutput  # noqa: E402
from cadence.worker.tp_executor import _FETCH, encode_step  # noqa: E402


def decode_step(batch: int, step: int, ids: list[str]) -> SchedulerOutput:
    """A steady decode step of ``batch`` requests (one with a new block, as every 16 steps)."""
    cached = CachedRequestData(
        req_ids=list(ids),
        new_block_ids=[[1000 + step] if i == step % batch else None for i in range(batch)],
        num_computed_tokens=[512 + step] * batch,
    )
    return SchedulerOutput([], cached, dict.fromkeys(ids, 1), batch)


def runner_output(batch: int, ids: list[str]) -> ModelRunnerOutput:
    return ModelRunnerOutput(list(ids), {r: i for i, r in enumerate(ids)},
                             [[1234 + i] for i in range(batch)])


def _rank(conn: Connection, rank: int, batch: int, ids: list[str], stats: Connection) -> None:
    out = runner_output(batch, ids)
    unpickle: list[float] = []
    while True:
        data = conn.recv_bytes()
        t = time.perf_counter()
        msg = pickle.loads(data)
        if msg[0] == "step":
            unpickle.append(time.perf_counter() - t)
        elif msg[0] == "fetch":
            conn.send(("ok", out))
        else:
            stats.send(unpickle)
            return


def measure(batch: int = 64, ranks: int = 2, steps: int = 2000) -> dict[str, float]:
    ids = [f"cmpl-{uuid.uuid4().hex}-0" for _ in range(batch)]
    ctx = multiprocessing.get_context("spawn")
    conns, procs, stats = [], [], []
    for rank in range(ranks):
        ours, theirs = ctx.Pipe()  # a socket pair, as the executor's
        st_recv, st_send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_rank, args=(theirs, rank, batch, ids, st_send), daemon=True)
        p.start()
        theirs.close()
        conns.append(ours)
        procs.append(p)
        stats.append(st_recv)
    send_s: list[float] = []
    fetch_s: list[float] = []
    size = 0
    for step in range(steps):
        so = decode_step(batch, step, ids)
        t0 = time.perf_counter()
        data = encode_step(so)
        for c in conns:
            c.send_bytes(data)
        t1 = time.perf_counter()
        conns[0].send_bytes(_FETCH)
        conns[0].recv()
        t2 = time.perf_counter()
        send_s.append(t1 - t0)
        fetch_s.append(t2 - t1)
        size = len(data)
    stop = pickle.dumps(("stop",))
    for c in conns:
        c.send_bytes(stop)
    unpickle = stats[0].recv()
    for p in procs:
        p.join(10)
    skip = steps // 10  # warm-up
    return {
        "batch": batch, "ranks": ranks, "steps": steps, "message_bytes": size,
        "send_us_median": 1e6 * statistics.median(send_s[skip:]),
        "send_us_p90": 1e6 * statistics.quantiles(send_s[skip:], n=10)[-1],
        "fetch_round_trip_us_median": 1e6 * statistics.median(fetch_s[skip:]),
        "rank_unpickle_us_median": 1e6 * statistics.median(unpickle[skip:]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=2000)
    ns = p.parse_args()
    figures = measure(ns.batch, ns.ranks, ns.steps)
    print(json.dumps({k: round(v, 1) if isinstance(v, float) else v
                      for k, v in figures.items()}))


if __name__ == "__main__":
    main()
