"""The output pump alone, between a scripted core and a scripted output processor."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from cadence.core_types import EngineCoreOutputs, SchedulerStats
from cadence.engine.output_processor import IterationStats, OutputProcessorOutput
from cadence.engine.output_pump import OUTPUT_CHUNK_SIZE, OutputPump
from cadence.engine.request_ledger import RequestLedger


class _CoreGone(Exception):
    pass


@dataclass
class ScriptedCore:
    steps: list[EngineCoreOutputs]
    added: list[Any] = field(default_factory=list)
    aborted: list[list[str]] = field(default_factory=list)

    async def get_output_async(self) -> EngineCoreOutputs:
        if not self.steps:
            raise _CoreGone
        return self.steps.pop(0)

    def add_request(self, request: Any) -> None:
        self.added.append(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.aborted.append(list(request_ids))


@dataclass
class ScriptedProcessor:
    """Ends (as a stop string would) the ids in ``stop``; adds ``children`` on the first call."""

    stop: set[str] = field(default_factory=set)
    children: list[str] = field(default_factory=list)
    slices: list[tuple[int, int]] = field(default_factory=list)  # (rows, id of the stats)

    def process_outputs(self, chunk: list[Any], timestamp: float,
                        stats: IterationStats) -> OutputProcessorOutput:
        self.slices.append((len(chunk), id(stats)))
        stats.num_generation_tokens += len(chunk)
        to_add, self.children = self.children, []
        return OutputProcessorOutput([], [r for r in chunk if r in self.stop], reqs_to_add=to_add)


@dataclass
class Recorder:
    calls: list[tuple[SchedulerStats | None, IterationStats | None]] = field(default_factory=list)

    def record(self, scheduler_stats: SchedulerStats | None,
               iteration_stats: IterationStats | None) -> None:
        self.calls.append((scheduler_stats, iteration_stats))


class Broken:
    def record(self, *_: Any) -> None:
        raise RuntimeError("metrics backend down")


def _pump(steps: list[EngineCoreOutputs], processor: ScriptedProcessor,
          errored: bool = False) -> tuple[OutputPump, ScriptedCore, RequestLedger]:
    core, ledger = ScriptedCore(steps), RequestLedger()
    return OutputPump(core, processor, ledger, lambda: errored), core, ledger  # type: ignore[arg-type]


async def _run_until_core_gone(pump: OutputPump) -> None:
    with pytest.raises(_CoreGone):
        await pump.run()


async def test_a_large_step_goes_in_slices_with_one_statistics_record() -> None:
    rows = 2 * OUTPUT_CHUNK_SIZE + 7
    stats = SchedulerStats(num_running_reqs=3)
    processor = ScriptedProcessor()
    pump, _, _ = _pump([EngineCoreOutputs(outputs=[f"r{i}" for i in range(rows)],  # type: ignore[misc]
                                          scheduler_stats=stats)], processor)
    recorder = Recorder()
    pump.stat_loggers.append(recorder)
    await _run_until_core_gone(pump)
    assert [n for n, _ in processor.slices] == [OUTPUT_CHUNK_SIZE, OUTPUT_CHUNK_SIZE, 7]
    assert len({s for _, s in processor.slices}) == 1  # one step, one IterationStats
    assert len(recorder.calls) == 1
    assert recorder.calls[0][0] is stats and pump.last_scheduler_stats is stats
    it = recorder.calls[0][1]
    assert it is not None and it.num_generation_tokens == rows


async def test_stop_string_ends_are_aborted_in_the_core_and_drain_until_it_reports_them() -> None:
    processor = ScriptedProcessor(stop={"a", "b"}, children=["child"])
    first = EngineCoreOutputs(outputs=["a", "b", "c"], finished_requests={"b"})  # type: ignore[list-item]
    pump, core, ledger = _pump([first], processor)
    await _run_until_core_gone(pump)
    assert core.added == ["child"]
    assert core.aborted == [["a", "b"]]
    # "b" finished in the core this step: nothing more will come of it; "a" may still report.
    assert ledger.draining_event("b") is None
    assert ledger.draining_event("a") is not None
    core.steps.append(EngineCoreOutputs(finished_requests={"a"}))
    await _run_until_core_gone(pump)
    assert ledger.draining_event("a") is None


async def test_an_errored_engine_starts_no_drain() -> None:
    pump, core, ledger = _pump([EngineCoreOutputs(outputs=["a"])],  # type: ignore[list-item]
                               ScriptedProcessor(stop={"a"}), errored=True)
    await _run_until_core_gone(pump)
    assert core.aborted == [["a"]] and ledger.draining_event("a") is None


async def test_a_failing_stat_logger_spares_the_rest_and_the_engine_gone_record_zeroes() -> None:
    pump, _, ledger = _pump([], ScriptedProcessor())
    recorder = Recorder()
    pump.stat_loggers[:] = [Broken(), recorder]  # type: ignore[list-item]
    pump.record_stats(SchedulerStats(num_running_reqs=2, num_waiting_reqs=1), None)
    ledger.start_draining(["x"])
    event = ledger.draining_event("x")
    pump.record_engine_gone()
    assert [c[0].num_running_reqs for c in recorder.calls if c[0]] == [2, 0]
    assert recorder.calls[-1][0] == SchedulerStats()
    assert event is not None and event.is_set() and ledger.draining_event("x") is None


def test_the_pump_is_cancellable_while_it_waits() -> None:
    class Waiting(ScriptedCore):
        async def get_output_async(self) -> EngineCoreOutputs:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    async def main() -> None:
        pump = OutputPump(Waiting([]), ScriptedProcessor(), RequestLedger(),  # type: ignore[arg-type]
                          lambda: False)
        task = asyncio.create_task(pump.run())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
