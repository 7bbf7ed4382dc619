"""Carriers that cross process boundaries survive pickling field for field."""

from __future__ import annotations

import pickle
import time
from dataclasses import fields

from cadence.core_types import EngineCoreOutput, EngineCoreOutputs, FinishReason, SchedulerStats
from cadence.runner_output import LogprobsLists


def test_engine_core_output_pickles_every_field() -> None:
    values = dict(request_id="r", new_token_ids=[5, 6], new_logprobs=[([5, 1], [-0.1, -2.0], 1)],
                  finish_reason=FinishReason.STOP, stop_reason="###", num_cached_tokens=16,
                  error="boom",
                  new_prompt_logprobs=(1, LogprobsLists([[3, 3]], [[-0.5, -0.5]], [1])),
                  timing=(1.5, 2.5))
    assert {f.name for f in fields(EngineCoreOutput)} == set(values)  # a new field needs a test
    out = EngineCoreOutput(**values)
    back = pickle.loads(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == out and back.finished
    step = EngineCoreOutputs([out, EngineCoreOutput("q", [7])], SchedulerStats(3, 1, 0.5), {"r"})
    again = pickle.loads(pickle.dumps(step))
    assert again.outputs == step.outputs and again.finished_requests == {"r"}
    assert again.scheduler_stats == step.scheduler_stats and again.timestamp == step.timestamp


def test_defaults_and_clocks() -> None:
    """A request's arrival is wall-clock time (the input processor's clock); a step's
    timestamp is monotonic (the front end's latency clock); a request's priority is 0."""
    from cadence.core_types import EngineCoreRequest
    from cadence.sampling_params import SamplingParams

    wall, mono = time.time(), time.monotonic()
    req = EngineCoreRequest("r", [1], SamplingParams())
    outs = EngineCoreOutputs()
    assert wall <= req.arrival_time <= time.time()
    assert mono <= outs.timestamp <= time.monotonic()
    assert req.priority == 0 and req.eos_token_id is None and req.cache_salt is None
    assert outs.outputs == [] and outs.finished_requests == set()
    assert SchedulerStats() == SchedulerStats(0, 0, 0.0, 0, 0, 0)
    assert [str(r) for r in FinishReason] == ["stop", "length", "abort", "error", "repetition"]
