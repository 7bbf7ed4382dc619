"""Structured outputs in the runner: one xgrammar matcher per constrained request and, each step,
the token bitmask of the rows that sample under a grammar.

A matcher advances only on tokens that are final: the outputs the host knows (recorded when a
step's output reaches it) and, under async scheduling, the token still in flight from the step
before, read from that step's host copy (its copy was issued a step earlier, so the wait is
short). The bitmask is filled while the step's forward runs on the device, and only the rows
under a grammar travel to it (``grammar_mask``). Requests without a grammar are never looked at.
Grammars compile on the compiler's own thread, once per distinct spec (``grammar_compiler``);
the scheduler holds a request back until its grammar is ready.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from cadence.sampling_params import SamplingParams, StructuredOutputsParams
from cadence.worker.grammar_compiler import GrammarCompilerService, grammar_of, xgrammar_module
from cadence.worker.grammar_mask import GrammarMask, MaskStaging

logger = logging.getLogger(__name__)

# A batched fill longer than this on one thread goes to xgrammar's thread pool.
_THREADED_FILL_S = 300e-6


__all__ = ["GrammarState", "check_structured_outputs", "grammar_of"]


def check_structured_outputs(spec: StructuredOutputsParams) -> None:
    """Parse ``spec`` once (in the front end): an invalid schema or grammar is the request's
    error, not the engine's."""
    try:
        grammar_of(spec)
    except RecursionError:  # a parser's recursion on nesting the depth bound let through
        raise ValueError("structured_outputs: the schema or grammar nests too deeply.") from None


NO_TOKEN_FITS = "structured_outputs: a sampled token does not fit the request's grammar."


@dataclass
class _Constrained:
    matcher: Any
    accepted: int = 0  # outputs the matcher has consumed (or passed over while reasoning)
    history: list[int] = field(default_factory=list)  # outputs the host knows, in order
    tags: tuple[int, int] | None = None  # reasoning (start, end) token ids
    reasoning: bool = False  # inside the reasoning: the grammar does not apply yet


def reasoning_open(prompt: Sequence[int], tags: tuple[int, int]) -> bool:
    """Whether output after ``prompt`` is reasoning until an end tag (vLLM, under a reasoning
    parser): unless the prompt's last reasoning tag is the end tag (a template that turned
    thinking off closes it there), the grammar waits for the output's end tag."""
    start, end = tags
    for token in reversed(prompt):
        if token in (start, end):
            return token == start
    return True


class GrammarState:
    def __init__(self, tokenizer_path: str | None, vocab_size: int, max_rows: int = 0,
                 device: torch.device | None = None) -> None:
        self.vocab_size = vocab_size
        self.compiler = GrammarCompilerService(tokenizer_path)
        self._max_rows = max_rows
        self._device = device or torch.device("cpu")
        self._staging: MaskStaging | None = None  # allocated with the first grammar row
        self._batchers: dict[bool, Any] = {}  # threaded or not -> xgrammar batch matcher
        self._row_fill_s = 0.0  # moving average of one row's fill, single-threaded
        self._fills = 0
        self._reqs: dict[str, _Constrained] = {}
        # Requests whose sampled token broke their grammar since the last take_failed().
        self._failed: dict[str, str] = {}

    @property
    def active(self) -> bool:
        return bool(self._reqs)

    def prefetch(self, spec: StructuredOutputsParams) -> Future:
        """Start compiling ``spec`` (on the compiler's thread); the future is done once it is."""
        return self.compiler.submit(spec)

    def admit(self, req_id: str, params: SamplingParams, outputs: Sequence[int],
              prompt: Sequence[int] = ()) -> None:
        """A constrained request (re)admitted with ``outputs`` already generated after
        ``prompt``."""
        spec = params.structured_outputs
        assert spec is not None
        matcher = xgrammar_module().GrammarMatcher(self.compiler.get(spec))
        tags = spec.reasoning_tags
        state = _Constrained(matcher, history=list(outputs), tags=tags,
                             reasoning=tags is not None and reasoning_open(prompt, tags))
        self._reqs[req_id] = state
        self._advance(req_id, state, len(outputs))

    def retain(self, live: Mapping[str, int]) -> None:
        for req_id in [r for r in self._reqs if r not in live]:
            del self._reqs[req_id]

    def forget(self, req_id: str) -> None:
        self._reqs.pop(req_id, None)

    def wants(self, req_id: str) -> object | None:
        """The request's admission (its state) if it is constrained."""
        return self._reqs.get(req_id)

    def record(self, req_id: str, index: int, token: int, admission: object) -> None:
        """Output ``index`` of ``req_id`` reached the host; taken only by the admission it was
        sampled for (``RecordingOutput``'s NOTE)."""
        state = self._reqs.get(req_id)
        if state is not None and state is admission and len(state.history) == index:
            if token < 0:  # NO_TOKEN: the request is failing; nothing more to constrain
                self._reqs.pop(req_id, None)
                return
            state.history.append(token)

    def take_failed(self) -> dict[str, str]:
        """Requests whose output broke their grammar since the last call (id -> reason)."""
        failed, self._failed = self._failed, {}
        return failed

    def _advance(self, req_id: str, state: _Constrained, upto: int) -> bool:
        """Feed the matcher the outputs up to ``upto``; False if one broke the grammar: the
        request is reported failed and constrained no longer."""
        while state.accepted < upto:
            token = state.history[state.accepted]
            state.accepted += 1
            if state.reasoning:  # the grammar starts after the end tag, which it never sees
                state.reasoning = token != state.tags[1]
                continue
            if state.matcher.is_terminated():
                continue  # sampled past the grammar's end by a step scheduled ahead: dropped
            if not state.matcher.accept_token(token):
                # NOTE: a backstop. A row whose masks left no token is failed in its own step
                # (NO_TOKEN); a token outside the grammar otherwise means a broken mask.
                logger.warning("Request %r: token %d does not fit its grammar.", req_id, token)
                self._failed[req_id] = NO_TOKEN_FITS
                self._reqs.pop(req_id, None)
                return False
        return True

    def bitmask(self, req_ids: Sequence[str], num_outputs: Sequence[int],
                in_flight: Callable[[], Mapping[str, int]]) -> GrammarMask | None:
        """For sampling rows ``req_ids`` (that have sampled ``num_outputs`` tokens so far): the
        bitmasks of the rows under a live grammar, on the logits' device (None if there are
        none). ``in_flight()`` gives the previous step's tokens by request (read only when
        needed)."""
        peeked: Mapping[str, int] | None = None
        ready: list[tuple[int, str]] = []
        for row, req_id in enumerate(req_ids):
            state = self._reqs.get(req_id)
            if state is None:
                continue
            need = num_outputs[row]
            if len(state.history) < need:
                if peeked is None:
                    peeked = in_flight()
                token = peeked.get(req_id)
                if token is not None and token < 0:  # NO_TOKEN: the request is failing
                    self._reqs.pop(req_id, None)
                    continue
                if token is not None and len(state.history) == need - 1:
                    state.history.append(token)
            try:
                if not self._advance(req_id, state, min(need, len(state.history))):
                    continue
            except Exception:
                self._drop(req_id)
                continue
            # A finished grammar (its stop token taken) leaves the row free: that request has
            # ended, and a step scheduled ahead of that news samples a token it drops. So does
            # reasoning: the grammar applies after it.
            if not state.reasoning and not state.matcher.is_terminated():
                ready.append((row, req_id))
        if not ready:
            return None
        staging = self._get_staging(len(req_ids))
        k = len(ready)
        words, rows = staging.host(k)
        rows.numpy()[:] = [row for row, _ in ready]
        if k > 1:
            try:  # one call for every row
                self._fill(k, [self._reqs[r].matcher for _, r in ready], words)
                return staging.upload(k)
            except Exception:
                logger.exception("Batched grammar masks failed; filling them one by one.")
        for i, (_, req_id) in enumerate(ready):
            try:
                self._reqs[req_id].matcher.fill_next_token_bitmask(words, i)
            except Exception:
                words[i].fill_(-1)  # the row may be half written: it goes free
                self._drop(req_id)
        return staging.upload(k)

    def close(self) -> None:
        """Stop the compiler and free the staging (before the streams that used it close)."""
        self.compiler.close()
        if self._staging is not None:
            self._staging.close()
            self._staging = None

    def _get_staging(self, rows: int) -> MaskStaging:
        if self._staging is None or self._staging.max_rows < rows:
            self._staging = MaskStaging(max(rows, self._max_rows), self.vocab_size,
                                        self.compiler.mask_vocab, self._device)
        return self._staging

    def _drop(self, req_id: str) -> None:
        # NOTE: one request's grammar must never stop the engine: it goes unconstrained from
        # here on, loudly.
        logger.exception("Request %r: its grammar failed; it is no longer constrained.", req_id)
        self._reqs.pop(req_id, None)

    def _fill(self, k: int, matchers: list[Any], words: torch.Tensor) -> None:
        """One batched fill. xgrammar's threads cost more than they save on cheap masks (~3 us a
        row): rows go to them only when one thread would take longer than _THREADED_FILL_S."""
        self._fills += 1
        # Every 64th fill runs on one thread, so that the estimate follows the grammars.
        threaded = k * self._row_fill_s > _THREADED_FILL_S and self._fills % 64 != 0
        batcher = self._batchers.get(threaded)
        if batcher is None:
            xgr = xgrammar_module()
            batcher = self._batchers[threaded] = (
                xgr.BatchGrammarMatcher() if threaded else xgr.BatchGrammarMatcher(max_threads=1))
        start = time.perf_counter()
        batcher.batch_fill_next_token_bitmask(matchers, words)
        if not threaded:
            row = (time.perf_counter() - start) / k
            self._row_fill_s = row if self._fills == 1 else 0.8 * self._row_fill_s + 0.2 * row

