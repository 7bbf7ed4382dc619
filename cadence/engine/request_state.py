"""The output processor's state of one request: incremental detokenization, logprob rows
(token texts decoded once per id), metrics, and the ``RequestOutput`` of each step."""

from __future__ import annotations

from typing import Any

from cadence.core_types import EngineCoreOutput, EngineCoreRequest, FinishReason
from cadence.engine.detokenizer import IncrementalDetokenizer, make_decode_fn
from cadence.engine.output_collector import OutputSink
from cadence.engine.parent_request import ParentRequest
from cadence.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from cadence.sampling_params import RequestOutputKind

__all__ = ["RequestState", "TokenTextCache"]


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
    ) -> None:
        params = request.sampling_params
        self.request_id = request.request_id
        self.parent = parent
        self.prompt = prompt
        self.prompt_token_ids = request.prompt_token_ids
        self.output_kind = params.output_kind
        self.queue = queue
        self.snapshot_metrics = queue is None or queue.needs_metrics
        # detokenize=False (vLLM): token ids only; the text and logprobs' tokens stay empty.
        detokenize = params.detokenize
        self.detokenizer = IncrementalDetokenizer(tokenizer if detokenize else None, request)
        self.token_text = token_text if detokenize else None
        self.num_logprobs = params.logprobs
        self.logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if params.logprobs is not None else None
        self.max_tokens_param = params.max_tokens
        self.num_prompt_logprobs = params.prompt_logprobs
        # vLLM's shape: None for the first prompt token, then one dict per prompt token.
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = (
            [None] if params.prompt_logprobs is not None else None)
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
            self.logprobs.append(self._logprob_row(ids[:n], lps[:n], rank))
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
            self.prompt_logprobs.append(self._logprob_row(ids[:n], lps[:n], rank))

    def _logprob_row(self, ids: list[int], lps: list[float], rank: int) -> dict[int, Logprob]:
        """The chosen token first, then the top-N. A chosen token among the top-N takes its
        place's rank there (vLLM's), so one row's ranks never repeat: ``rank`` counts the
        tokens at least as likely, which for a tie with a token ranked before it is one more
        than its place."""
        row: dict[int, Logprob] = {ids[0]: Logprob(lps[0], rank, self._decode_one(ids[0]))}
        for i in range(1, len(ids)):
            row[ids[i]] = Logprob(lps[i], i, self._decode_one(ids[i]))
        return row

    def _decode_one(self, token_id: int) -> str | None:
        return None if self.token_text is None else self.token_text.get(token_id)

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
                logprobs = list(logprobs)
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
            # Delta outputs carry them once, in the first output (vLLM).
            if delta and self.prompt_logprobs_sent:
                prompt_logprobs = None
            else:
                prompt_logprobs = list(prompt_logprobs)
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
