"""The front end's output pump: every engine step's outputs through the output processor into
the requests' sinks, its statistics to the stat loggers (the loop of vLLM v1's
``AsyncLLM.output_handler``). ``AsyncLLM`` runs it as one task and owns its failure."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from cadence.core_types import EngineCoreOutputs, SchedulerStats
from cadence.engine.core_client import EngineCoreClient
from cadence.engine.output_processor import IterationStats, OutputProcessor
from cadence.engine.request_ledger import RequestLedger
from cadence.metrics import StatLogger

logger = logging.getLogger(__name__)

__all__ = ["OUTPUT_CHUNK_SIZE", "OutputPump"]

# Engine outputs processed between two yields to the event loop (vLLM's output chunk size).
OUTPUT_CHUNK_SIZE = 128


class OutputPump:
    """Move the core's outputs to the output processor, and what it asks of the core back."""

    def __init__(self, core: EngineCoreClient, processor: OutputProcessor, ledger: RequestLedger,
                 errored: Callable[[], bool]) -> None:
        self.core = core
        self.processor = processor
        self.ledger = ledger
        self.errored = errored
        self.stat_loggers: list[StatLogger] = []
        self.last_scheduler_stats: SchedulerStats | None = None

    async def run(self) -> None:
        """Forever: ends only by cancellation or by the core's failure (raised)."""
        while True:
            outputs = await self.core.get_output_async()
            # One step's statistics (vLLM's), however many slices its outputs take.
            stats = IterationStats()
            self._process(outputs, 0, stats)
            for start in range(OUTPUT_CHUNK_SIZE, len(outputs.outputs), OUTPUT_CHUNK_SIZE):
                await asyncio.sleep(0)  # let consumers run between large chunks
                self._process(outputs, start, stats)
            self.record_stats(outputs.scheduler_stats, stats)
            # After every chunk: the ended requests' last tokens are behind us.
            self.ledger.stop_draining(outputs.finished_requests)

    def _process(self, outputs: EngineCoreOutputs, start: int, stats: IterationStats) -> None:
        chunk = outputs.outputs[start : start + OUTPUT_CHUNK_SIZE]
        processed = self.processor.process_outputs(chunk, outputs.timestamp, stats)
        for child in processed.reqs_to_add:
            self.core.add_request(child)
        if processed.reqs_to_abort:
            finished = outputs.finished_requests
            self.start_draining([r for r in processed.reqs_to_abort if r not in finished])
            self.core.abort_requests(processed.reqs_to_abort)

    def start_draining(self, request_ids: list[str]) -> None:
        """Ids ended here that the core may still report: a new request under one waits."""
        if not self.errored():  # else no report will come; add_request refuses every request
            self.ledger.start_draining(request_ids)

    def record_stats(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        if scheduler_stats is not None:
            self.last_scheduler_stats = scheduler_stats
        for stat_logger in self.stat_loggers:
            try:
                stat_logger.record(scheduler_stats, iteration_stats)
            except Exception:  # metrics must never take serving down
                logger.exception("Stat logger %r failed.", stat_logger)

    def record_engine_gone(self) -> None:
        """After a failure or shutdown: nothing runs, waits or holds KV blocks any more, and the
        gauges must not say otherwise; no drain will end by a report."""
        self.record_stats(SchedulerStats(), None)
        self.ledger.stop_all_draining()
