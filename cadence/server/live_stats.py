"""GET /stats: the engine's state now, per-second history of the last minutes, and its
configuration, as JSON for the browser page (and any client that prefers JSON to /metrics).

``SecondsRecorder`` is a stat logger: each engine step's stats land in the bucket of the current
second (O(1) per step, plus one pass over the step's latencies); a request for the history
builds one row per complete second, gaps filled (gauges carried forward, counts zero).
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cadence.core_types import SchedulerStats
from cadence.metrics import IterationStats

if TYPE_CHECKING:
    from cadence.engine.async_llm import AsyncLLM

__all__ = ["DEFAULT_WINDOW_S", "SecondsRecorder", "engine_config_summary"]

DEFAULT_WINDOW_S = 300


@dataclass
class _Second:
    """One second: gauges as last seen in it, counts and latencies of what happened in it."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0
    ttft_n: int = 0
    ttft_sum: float = 0.0
    ttft_max: float = 0.0
    itl_n: int = 0
    itl_sum: float = 0.0
    itl_max: float = 0.0

    def carried(self) -> _Second:
        """The next second before anything happened in it: this one's gauges, no counts."""
        return _Second(self.running, self.waiting, self.kv_cache_usage)

    def row(self, t: int) -> dict[str, Any]:
        return {
            "t": t,
            "running": self.running,
            "waiting": self.waiting,
            "kv_cache_usage": round(self.kv_cache_usage, 6),
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "finished": self.finished,
            "ttft_mean": _mean(self.ttft_sum, self.ttft_n),
            "ttft_max": round(self.ttft_max, 6) if self.ttft_n else None,
            "itl_mean": _mean(self.itl_sum, self.itl_n),
            "itl_max": round(self.itl_max, 6) if self.itl_n else None,
        }


def _mean(total: float, n: int) -> float | None:
    return round(total / n, 6) if n else None


class SecondsRecorder:
    """Per-second engine statistics over the last ``window_s`` seconds.

    Seconds are counted from the recorder's start (``clock``, monotonic); ``boot`` tells a
    client that a restarted server's seconds start again."""

    def __init__(self, window_s: int = DEFAULT_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if window_s < 1:
            raise ValueError(f"window_s must be at least 1, got {window_s}.")
        self.window_s = window_s
        self.clock = clock
        self.boot = uuid.uuid4().hex[:12]
        self._t0 = clock()
        self._seconds: deque[tuple[int, _Second]] = deque()
        self.latest = SchedulerStats()

    def now(self) -> int:
        """The current (incomplete) second."""
        return int(self.clock() - self._t0)

    def _current(self) -> _Second:
        t = self.now()
        if self._seconds and self._seconds[-1][0] == t:
            return self._seconds[-1][1]
        bucket = self._seconds[-1][1].carried() if self._seconds else _Second()
        self._seconds.append((t, bucket))
        # Keep the newest second at or before the window's start: the window's first seconds
        # carry its gauges when nothing was recorded in them.
        while len(self._seconds) > 1 and self._seconds[1][0] <= t - self.window_s:
            self._seconds.popleft()
        return bucket

    def record(self, scheduler_stats: SchedulerStats | None,
               iteration_stats: IterationStats | None) -> None:
        if scheduler_stats is None and iteration_stats is None:
            return
        b = self._current()
        if scheduler_stats is not None:
            self.latest = scheduler_stats
            b.running = scheduler_stats.num_running_reqs
            b.waiting = scheduler_stats.num_waiting_reqs
            b.kv_cache_usage = scheduler_stats.kv_cache_usage
        if iteration_stats is not None:
            it = iteration_stats
            b.prompt_tokens += it.num_prompt_tokens
            b.generation_tokens += it.num_generation_tokens
            b.finished += len(it.finished_requests)
            if it.time_to_first_tokens:
                b.ttft_n += len(it.time_to_first_tokens)
                b.ttft_sum += sum(it.time_to_first_tokens)
                b.ttft_max = max(b.ttft_max, *it.time_to_first_tokens)
            if it.inter_token_latencies:
                b.itl_n += len(it.inter_token_latencies)
                b.itl_sum += sum(it.inter_token_latencies)
                b.itl_max = max(b.itl_max, *it.inter_token_latencies)

    def history(self, since: int = -1) -> list[dict[str, Any]]:
        """One row per complete second after ``since``, within the window, oldest first."""
        now = self.now()
        first = max(since + 1, now - self.window_s, 0)
        rows: list[dict[str, Any]] = []
        stored = iter(list(self._seconds))
        pending = next(stored, None)
        last = _Second()
        for t in range(first, now):
            while pending is not None and pending[0] < t:
                last = pending[1]
                pending = next(stored, None)
            if pending is not None and pending[0] == t:
                last = pending[1]
                rows.append(last.row(t))
                pending = next(stored, None)
            else:
                rows.append(last.carried().row(t))
        return rows


def engine_config_summary(engine: AsyncLLM, served_model_name: str) -> dict[str, Any]:
    """What the engine runs with, for people (the page's configuration table)."""
    from cadence.graphs.sizes import capture_sizes, token_capture_sizes

    cfg = engine.config
    sched = cfg.scheduler
    graphs: dict[str, Any] = {"enabled": cfg.use_graphs}
    if cfg.use_graphs:
        decode = capture_sizes(sched.max_num_seqs)
        mixed = token_capture_sizes(cfg.graphs.max_capture_tokens)
        graphs["decode_batch_sizes"] = decode
        graphs["mixed_token_sizes"] = mixed
        graphs["emulated"] = cfg.device != "cuda"
    return {
        "model": cfg.model.model,
        "served_model_name": served_model_name,
        "has_tokenizer": engine.tokenizer is not None,
        "device": cfg.device,
        "dtype": cfg.dtype,
        "max_model_len": engine.max_model_len,
        "max_num_seqs": sched.max_num_seqs,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "policy": sched.policy,
        "async_scheduling": sched.async_scheduling,
        "chunked_prefill": sched.enable_chunked_prefill,
        "prefix_caching": cfg.cache.enable_prefix_caching,
        "block_size": engine.block_size,
        "num_kv_blocks": engine.num_kv_blocks,
        "graphs": graphs,
    }


def stats_document(seconds: SecondsRecorder, status: str, version: str, since: int,
                   config: dict[str, Any] | None) -> dict[str, Any]:
    """GET /stats' body: the status, the latest second's state, the seconds after ``since``
    (all kept for -1), and ``config`` where given (a client's first request)."""
    latest = seconds.latest
    body: dict[str, Any] = {
        "status": status,
        "version": version,
        "boot": seconds.boot,
        "second": seconds.now(),
        "window_s": seconds.window_s,
        "now": {
            "running": latest.num_running_reqs,
            "waiting": latest.num_waiting_reqs,
            "kv_cache_usage": latest.kv_cache_usage,
            "num_preemptions": latest.num_preemptions,
            "prefix_cache_queries": latest.prefix_cache_queries,
            "prefix_cache_hits": latest.prefix_cache_hits,
        },
        "history": seconds.history(since),
    }
    if config is not None:
        body["config"] = config
    return body

