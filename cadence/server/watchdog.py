"""Engine health as the server reports it: dead, stalled, or serving.

The engine is *dead* once its core thread has stopped (a fault, or shutdown). It is *stalled*
while requests are unfinished and no engine step has completed for ``stall_timeout`` seconds
(a hung kernel, a deadlock): /health then answers 503 and the log says why, once per episode;
nothing is killed for a stall.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cadence.engine.async_llm import AsyncLLM

__all__ = ["DEFAULT_ENGINE_STALL_TIMEOUT_S", "EngineWatchdog"]

logger = logging.getLogger(__name__)

DEFAULT_ENGINE_STALL_TIMEOUT_S = 60.0


class EngineWatchdog:
    """Checks the engine on demand (from /health and a periodic tick); logs state changes."""

    def __init__(self, engine: AsyncLLM, stall_timeout: float = DEFAULT_ENGINE_STALL_TIMEOUT_S):
        if not stall_timeout > 0:
            raise ValueError(f"stall_timeout must be positive, got {stall_timeout}.")
        self.engine = engine
        self.stall_timeout = stall_timeout
        self._stalled = False
        self._dead_logged = False

    @property
    def dead(self) -> bool:
        return self.engine.errored

    def problem(self) -> str | None:
        """Why the engine cannot serve now, or None when it can."""
        if self.engine.errored:
            if not self._dead_logged:
                self._dead_logged = True
                logger.error("The engine is not running; /health reports 503.")
            return "The engine is not running."
        waited = self.engine.seconds_without_progress()
        if waited > self.stall_timeout:
            unfinished = self.engine.output_processor.get_num_unfinished_requests()
            reason = (
                f"The engine is stalled: {unfinished} unfinished request(s) and no completed "
                f"step for {waited:.1f} s (limit {self.stall_timeout:g} s)."
            )
            if not self._stalled:
                self._stalled = True
                logger.error("%s /health reports 503.", reason)
            return reason
        if self._stalled:
            self._stalled = False
            logger.warning("The engine completes steps again; /health reports 200.")
        return None
