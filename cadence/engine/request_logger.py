"""What ``--enable-log-requests`` logs of each request (vLLM's ``RequestLogger``): its prompt
and parameters when it arrives (or is refused), its end, and aborts. Prompts are cut to
``max_log_len`` characters or token ids (None: whole)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cadence.outputs import RequestOutput
    from cadence.sampling_params import SamplingParams

__all__ = ["RequestLogger", "clipped"]


def clipped(value: Any, max_len: int | None) -> Any:
    """A logged prompt's text or token ids, cut to ``max_len`` (None: whole)."""
    if value is None or max_len is None:
        return value
    return value[:max_len]


def _given_prompt(prompt: Any) -> Any:
    """What a refused request's log shows of its prompt: the text, else the token ids."""
    if isinstance(prompt, dict):
        return prompt.get("prompt", prompt.get("prompt_token_ids"))
    return prompt


class RequestLogger:
    """Logs through ``logger`` (the front end's own, so its level and handlers apply)."""

    def __init__(self, logger: logging.Logger, max_log_len: int | None = None) -> None:
        self.logger = logger
        self.max_log_len = max_log_len

    def refused(self, request_id: str, prompt: Any, params: SamplingParams,
                error: Exception) -> None:
        # vLLM logs a request before its checks: a refusal too.
        self.logger.info("Received request %r: prompt: %r, params: %s; refused: %s",
                         request_id, clipped(_given_prompt(prompt), self.max_log_len), params,
                         error)

    def received(self, request_id: str, prompt_text: str | None, params: SamplingParams,
                 prompt_token_ids: Sequence[int]) -> None:
        self.logger.info("Received request %r: prompt: %r, params: %s, prompt_token_ids: %s.",
                         request_id, clipped(prompt_text, self.max_log_len), params,
                         clipped(prompt_token_ids, self.max_log_len))
        self.logger.info("Added request %r.", request_id)

    def finished(self, request_id: str, output: RequestOutput) -> None:
        self.logger.info("Finished request %r (finish reason %s).", request_id,
                         ", ".join(str(c.finish_reason) for c in output.outputs))

    def left(self, request_id: str) -> None:
        self.logger.info("Request %r aborted by its consumer.", request_id)

    def aborted(self, request_ids: Sequence[str]) -> None:
        self.logger.info("Aborted request(s) %s.", ",".join(request_ids))
