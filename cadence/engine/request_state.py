"""The output processor's state of one request: incremental detokenization, logprob rows
(token texts decoded once per id), metrics, and the ``RequestOutput`` of each step."""

from __future__ import annotations

import os
from typing import Any

from cadence.core_types import EngineCoreOutput, EngineCoreRequest, FinishReason
from cadence.engine.detokenizer import IncrementalDetokenizer, make_decode_fn
from cadence.engine.output_collector import OutputSink
from cadence.engine.parent_request import ParentRequest
from cadence.outputs import (
    CompletionOutput,
    FlatLogprobs,
    Logprob,
    PromptLogprobs,
    RequestMetrics,
    RequestOutput,
    SampleLogprobs,
)
from cadence.sampling_params import RequestOutputKind

__all__ = ["RequestState", "TokenTextCache"]


_PIECE = "\ufffd"  # what a token holding part of a UTF-8 character decodes to
_MAX_CONTEXT = 4  # a UTF-8 character spans at most 4 bytes, so at most 4 tokens


class TokenTextCache:
    """Text of single tokens (for logprobs), decoded once per token id."""

    def __init__(self, tokenizer: Any) -> None:
        self._decode = make_decode_fn(tokenizer)
        self._texts: dict[int, str] = {}

    def get(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._decode([token_id], False)
        return text

    def in_context(self, token_id: int, context: list[int]) -> str:
        """The text ``token_id`` adds after ``context`` (the tokens before it, oldest first).

        A token holding part of a UTF-8 character decodes alone to U+FFFD. As vLLM's logprobs
        processor does, its text is then found with up to 4 tokens before it: the token that
        completes a character shows the whole character (the pieces before it, which showed
        nothing, included); a piece that completes nothing yet shows "".
        """
        text = self.get(token_id)
        if not text.endswith(_PIECE):
            return text
        for n in range(1, min(len(context), _MAX_CONTEXT) + 1):
            before = context[-n:]
            joined = self._decode([*before, token_id], False)
            if joined.endswith(_PIECE):
                continue
            # The trailing pieces of the context showed no text: theirs is this token's.
            clean = len(before)
            while clean and self.get(before[clean - 1]).endswith(_PIECE):
                clean -= 1
            prefix = self._decode(before[:clean], False) if clean else ""
            return joined[len(os.path.commonprefix([prefix, joined])):]
        return ""


class RequestState:
    """One unfinished request's output state: its detokenizer, logprobs and metrics."""

    def __init__(
        self,
        request: EngineCoreRequest,
        prompt: str | None,
        tokenizer: Any | None,
        queue: OutputSink | None,
        arrival_time: float,
        token_text: TokenTextCache | None,
        parent: ParentRequest | None = None,
        stream_interval: int = 1,
    ) -> None:
        """``stream_interval``: the engine's; a request's own may only raise it."""
        params = request.sampling_params
        self.request_id = request.request_id
        self.parent = parent
        self.prompt = prompt
        self.prompt_token_ids = request.prompt_token_ids
        self.output_kind = params.output_kind
        # Outputs every ``stream_interval`` new tokens (and the first and last); the tokens and
        # logprob rows of steps without one wait here.
        # vLLM: a request's own interval may raise the engine's, never lower it.
        self.stream_interval = max(params.stream_interval or 1, stream_interval)
        self._held_ids: list[int] = []
        self._held_logprobs = 0
        self._sent_any = False
        self.queue = queue
        self.snapshot_metrics = queue is None or queue.needs_metrics
        # detokenize=False (vLLM): token ids only; the text and logprobs' tokens stay empty.
        detokenize = params.detokenize
        self.detokenizer = IncrementalDetokenizer(tokenizer if detokenize else None, request)
        self.token_text = token_text if detokenize else None
        self.num_logprobs = params.num_logprobs
        wanted = self.num_logprobs is not None
        make = FlatLogprobs if params.flat_logprobs else list
        self.logprobs: SampleLogprobs | None = make() if wanted else None
        self.cumulative_logprob: float | None = 0.0 if wanted else None
        self.max_tokens_param = params.max_tokens
        self.num_prompt_logprobs = params.prompt_logprobs
        # vLLM's shape: None for the first prompt token, then one dict per prompt token.
        self.prompt_logprobs: PromptLogprobs | None = None
        if params.prompt_logprobs is not None:
            self.prompt_logprobs = make()
            self.prompt_logprobs.append(None)
        self.prompt_logprobs_sent = False
        self.num_cached_tokens = 0
        self.metrics = RequestMetrics(arrival_time=arrival_time)

    def update_logprobs(self, output: EngineCoreOutput) -> int:
        """Append this output's logprob rows; returns how many were added."""
        if self.logprobs is None or not output.new_logprobs:
            return 0
        assert self.num_logprobs is not None and self.cumulative_logprob is not None
        n = self.num_logprobs + 1
        for ids, lps, rank in output.new_logprobs:
            # The context of a piece of a character: the tokens sampled before it (vLLM's).
            context = [next(iter(row)) for row in self.logprobs[-_MAX_CONTEXT:]]
            self.logprobs.append(self._logprob_row(ids[:n], lps[:n], rank, context))
            self.cumulative_logprob += lps[0]
        return len(output.new_logprobs)

    def update_prompt_logprobs(self, output: EngineCoreOutput) -> None:
        """Append the prompt tokens this output scored (once each: a recomputation after
        preemption scores them again)."""
        if self.prompt_logprobs is None or output.new_prompt_logprobs is None:
            return
        first, rows = output.new_prompt_logprobs
        skip = len(self.prompt_logprobs) - first
        assert self.num_prompt_logprobs is not None and skip >= 0
        n = self.num_prompt_logprobs + 1
        for ids, lps, rank in list(zip(rows.logprob_token_ids, rows.logprobs,
                                       rows.sampled_token_ranks))[skip:]:
            # Row p scores prompt token p; the prompt tokens before it are its context.
            p = len(self.prompt_logprobs)
            context = self.prompt_token_ids[max(0, p - _MAX_CONTEXT):p]
            self.prompt_logprobs.append(self._logprob_row(ids[:n], lps[:n], rank, context))

    def _logprob_row(self, ids: list[int], lps: list[float], rank: int, context: list[int]
                     ) -> dict[int, Logprob]:
        """The chosen token first, then the top-N. A chosen token among the top-N takes its
        place's rank there (vLLM's), so one row's ranks never repeat: ``rank`` counts the
        tokens at least as likely, which for a tie with a token ranked before it is one more
        than its place."""
        text = self.token_text
        row: dict[int, Logprob] = {ids[0]: Logprob(
            lps[0], rank, None if text is None else text.in_context(ids[0], context))}
        for i in range(1, len(ids)):
            row[ids[i]] = Logprob(lps[i], i,
                                  None if text is None else text.in_context(ids[i], context))
        return row

    def unsent(self) -> tuple[str, list[int], list[dict[int, Logprob]] | None]:
        """What no delta output has carried yet, without decoding anything new: the decoded
        text past the last output's (a stop string's hold included), and the tokens and logprob
        rows that ``stream_interval`` held."""
        text = self.detokenizer.output_text[self.detokenizer.sent_offset:]
        rows = None
        if self.logprobs is not None:
            rows = self.logprobs[len(self.logprobs) - self._held_logprobs:]
        return text, list(self._held_ids), rows

    def make_output(
        self,
        new_token_ids: list[int],
        num_new_logprobs: int,
        finish_reason: FinishReason | None,
        stop_reason: int | str | None,
    ) -> RequestOutput | None:
        finished = finish_reason is not None
        if not finished and self.output_kind == RequestOutputKind.FINAL_ONLY:
            return None
        if self.stream_interval > 1:
            self._held_ids += new_token_ids
            self._held_logprobs += num_new_logprobs
            if not (finished or not self._sent_any
                    or len(self._held_ids) >= self.stream_interval):
                return None
            new_token_ids, num_new_logprobs = self._held_ids, self._held_logprobs
            self._held_ids, self._held_logprobs = [], 0
        self._sent_any = True
        delta = self.output_kind == RequestOutputKind.DELTA
        text = self.detokenizer.get_next_output_text(finished, delta)
        logprobs = self.logprobs
        if delta:
            token_ids = list(new_token_ids)
            if logprobs is not None:
                logprobs = logprobs[len(logprobs) - num_new_logprobs :]
        else:
            # Copies: an output handed out must not change when later tokens arrive.
            token_ids = list(self.detokenizer.output_token_ids)
            if logprobs is not None:
                logprobs = logprobs[:]
        completion = CompletionOutput(
            index=0,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=self.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=str(finish_reason) if finished else None,
            stop_reason=stop_reason if finished else None,
        )
        prompt_logprobs = self.prompt_logprobs
        if prompt_logprobs is not None:
            # Delta outputs carry them once, in the first output; later ones an empty list
            # (vLLM's: its pop leaves []).
            if delta and self.prompt_logprobs_sent:
                prompt_logprobs = []
            else:
                prompt_logprobs = prompt_logprobs[:]
            self.prompt_logprobs_sent = True
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[completion],
            finished=finished,
            num_cached_tokens=self.num_cached_tokens,
            metrics=self.metrics.copy() if finished or self.snapshot_metrics else None,
            prompt_logprobs=prompt_logprobs,
        )
