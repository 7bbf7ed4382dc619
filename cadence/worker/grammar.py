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

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from cadence.sampling_params import SamplingParams, StructuredOutputsParams
from cadence.worker.grammar_compiler import GrammarCompilerService, xgrammar_module
from cadence.worker.grammar_mask import GrammarMask, MaskStaging

logger = logging.getLogger(__name__)

# The longest run of whitespace a JSON grammar allows between tokens of the JSON text.
MAX_WHITESPACE_RUN = 4

__all__ = ["GrammarState", "check_structured_outputs", "grammar_of"]


def _xgr() -> Any:
    return xgrammar_module()


def grammar_of(spec: StructuredOutputsParams) -> Any:
    """The xgrammar ``Grammar`` of ``spec``; a ValueError names what is wrong with it."""
    xgr = _xgr()
    try:
        if spec.json is not None or spec.json_object:
            schema = spec.json if spec.json is not None else {"type": "object"}
            text = schema if isinstance(schema, str) else json.dumps(schema)
            # NOTE: runs of whitespace are bounded: a model that likes blanks could otherwise
            # pad the JSON for ever without breaking the grammar.
            return xgr.Grammar.from_json_schema(text, max_whitespace_cnt=MAX_WHITESPACE_RUN)
        if spec.regex is not None:
            return xgr.Grammar.from_regex(spec.regex)
        if spec.choice is not None:
            return xgr.Grammar.from_regex("|".join(re.escape(c) for c in spec.choice))
        return xgr.Grammar.from_ebnf(spec.grammar or "")
    except Exception as exc:  # xgrammar raises RuntimeError / its own errors
        kind = next(k for k in ("json", "json_object", "regex", "choice", "grammar")
                    if getattr(spec, k) not in (None, False))
        # xgrammar's messages start with a time stamp and a source location: keep the words.
        reason = re.sub(r"^\[[^\]]*\] \S+:\d+: ", "", str(exc).strip())
        raise ValueError(f"structured_outputs: invalid {kind}: {reason}") from None


def check_structured_outputs(spec: StructuredOutputsParams) -> None:
    """Parse ``spec`` once (in the front end): an invalid schema or grammar is the request's
    error, not the engine's."""
    grammar_of(spec)


@dataclass
class _Constrained:
    matcher: Any
    accepted: int = 0  # outputs the matcher has consumed
    history: list[int] = field(default_factory=list)  # outputs the host knows, in order


class GrammarState:
    def __init__(self, tokenizer_path: str | None, vocab_size: int, max_rows: int = 0,
                 device: torch.device | None = None) -> None:
        self.vocab_size = vocab_size
        self.compiler = GrammarCompilerService(tokenizer_path)
        self._max_rows = max_rows
        self._device = device or torch.device("cpu")
        self._staging: MaskStaging | None = None  # allocated with the first grammar row
        self._batcher: Any = None
        self._reqs: dict[str, _Constrained] = {}

    @property
    def active(self) -> bool:
        return bool(self._reqs)

    def prefetch(self, spec: StructuredOutputsParams) -> Future:
        """Start compiling ``spec`` (on the compiler's thread); the future is done once it is."""
        return self.compiler.submit(spec)

    def admit(self, req_id: str, params: SamplingParams, outputs: Sequence[int]) -> None:
        """A constrained request (re)admitted with ``outputs`` already generated."""
        assert params.structured_outputs is not None
        matcher = _xgr().GrammarMatcher(self.compiler.get(params.structured_outputs))
        state = _Constrained(matcher, history=list(outputs))
        self._reqs[req_id] = state
        self._advance(req_id, state, len(outputs))

    def retain(self, live: Mapping[str, int]) -> None:
        for req_id in [r for r in self._reqs if r not in live]:
            del self._reqs[req_id]

    def wants(self, req_id: str) -> bool:
        return req_id in self._reqs

    def record(self, req_id: str, index: int, token: int) -> None:
        state = self._reqs.get(req_id)
        if state is not None and len(state.history) == index:
            state.history.append(token)

    def _advance(self, req_id: str, state: _Constrained, upto: int) -> None:
        while state.accepted < upto:
            token = state.history[state.accepted]
            if not state.matcher.accept_token(token):
                logger.warning("Request %s: token %d does not fit its grammar.", req_id, token)
            state.accepted += 1

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
                if token is not None and len(state.history) == need - 1:
                    state.history.append(token)
            try:
                self._advance(req_id, state, min(need, len(state.history)))
            except Exception:
                self._drop(req_id)
                continue
            # A finished grammar (its stop token taken) leaves the row free: that request has
            # ended, and a step scheduled ahead of that news samples a token it drops.
            if not state.matcher.is_terminated():
                ready.append((row, req_id))
        if not ready:
            return None
        staging = self._get_staging(len(req_ids))
        k = len(ready)
        words, rows = staging.host(k)
        rows.numpy()[:] = [row for row, _ in ready]
        if k > 1:
            try:  # one call for every row, filled by xgrammar's own threads
                self._batch().batch_fill_next_token_bitmask(
                    [self._reqs[r].matcher for _, r in ready], words)
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
        logger.exception("Request %s: its grammar failed; it is no longer constrained.", req_id)
        self._reqs.pop(req_id, None)

    def _batch(self) -> Any:
        if self._batcher is None:
            self._batcher = _xgr().BatchGrammarMatcher()
        return self._batcher

