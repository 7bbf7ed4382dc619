"""Where a front end's per-request CPU work runs (tokenizing, chat templates, validation): on
the event loop at once when the input is small and the input thread idle, else in that thread.

One input thread, as in vLLM: a HF tokenizer is not safe to call from several threads, and
inline work never overlaps the thread's (it runs only while the thread is idle), so requests
use the tokenizer one at a time and in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from cadence.sampling_params import SamplingParams

# Per-request CPU work on an input at most this large (bytes, characters or tokens) runs on the
# event loop when the input thread is idle: for a small request the two thread hand-offs cost
# more than the work, and under load each may wait for the interpreter lock.
INLINE_INPUT_LIMIT = 4096

T = TypeVar("T")


class InputWorker:
    """The input thread and the rule for what runs inline. ``stopped`` is asked before inline
    work (a stopped engine takes no more requests); ``on_stopped(message=None)`` makes the
    error raised then, and when the thread is shut down."""

    def __init__(self, stopped: Callable[[], bool],
                 on_stopped: Callable[..., Exception]) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cadence-input")
        # Calls handed to the input thread that have not finished there (a caller that stops
        # waiting does not end the thread's work: inline work waits for that too).
        self._inflight = 0
        self._shut = False
        self._stopped = stopped
        self._on_stopped = on_stopped

    async def run_in_thread(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in the input thread."""
        loop = asyncio.get_running_loop()
        try:
            work = self._executor.submit(self._call, fn, args, kwargs)
        except RuntimeError as exc:  # the executor is shut down with the engine
            raise self._on_stopped("The engine was shut down.") from exc
        self._inflight += 1
        work.add_done_callback(lambda _: self._finished(loop))
        return await asyncio.wrap_future(work, loop=loop)

    def _call(self, fn: Callable[..., T], args: tuple, kwargs: dict) -> T:
        # Work still queued when the engine shuts down fails as the engine does: its caller
        # was not cancelled.
        if self._shut:
            raise self._on_stopped("The engine was shut down.")
        return fn(*args, **kwargs)

    def _finished(self, loop: asyncio.AbstractEventLoop) -> None:
        # Called in the input thread (or here, if already done): the count lives on the loop.
        try:
            loop.call_soon_threadsafe(self._done)
        except RuntimeError:  # the loop is closed: nothing runs inline any more
            pass

    def _done(self) -> None:
        self._inflight -= 1

    async def run(self, size: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``run_in_thread``, except that work on an input of ``size`` at most
        ``INLINE_INPUT_LIMIT`` runs here at once while the input thread is idle."""
        if size <= INLINE_INPUT_LIMIT and self._inflight == 0:
            if self._stopped():
                raise self._on_stopped()
            return fn(*args, **kwargs)
        return await self.run_in_thread(fn, *args, **kwargs)

    def shutdown(self) -> None:
        self._shut = True
        self._executor.shutdown(wait=False)


def params_size(params: SamplingParams) -> int:
    """The per-request work its sampling parameters bring (validated and copied): large token
    maps and grammars are handled off the event loop."""
    if not isinstance(params, SamplingParams):
        return 0
    so = params.structured_outputs
    grammar = INLINE_INPUT_LIMIT + 1 if so is not None else 0
    return (len(params.logit_bias or ()) + len(params.allowed_token_ids or ())
            + 16 * len(params.bad_words or ()) + grammar)


def input_size(prompt: object) -> int:
    """The size of a prompt for ``InputWorker.run``: its tokens. Text is always tokenized in the
    input thread (a tokenizer may be slow on pathological input; the loop must not wait)."""
    if isinstance(prompt, dict) and "prompt" not in prompt:
        prompt = prompt.get("prompt_token_ids")
    if isinstance(prompt, (list, tuple)):
        return len(prompt)
    return INLINE_INPUT_LIMIT + 1
