"""How a trace's GPU work and host ops find their step, on small hand-built traces."""

from __future__ import annotations

from cadence.trace.steps import BY_OP, parse


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: object) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    if args:
        event["args"] = args
    return event


def _steps(*starts: float) -> list[dict]:
    return [_x("user_annotation", "engine_step", t, 100) for t in starts]


def test_work_linked_only_through_its_host_op_takes_that_ops_step() -> None:
    """No correlation ids at all (an exporter that keeps only the "External id" links): a
    kernel that starts after the next step began still belongs to the step whose op launched
    it, not to the step running when it started."""
    events = [*_steps(0, 100),
              _x("cpu_op", "aten::mm", 10, 5, **{"External id": 7}),
              _x("kernel", "gemm", 150, 10, stream=7, **{"External id": 7})]
    parsed = parse({"traceEvents": events})
    assert [a.step for a in parsed.activities] == [0]
    assert parsed.attribution[BY_OP] == 1 and parsed.attribution["start_time"] == 0
    assert [s.kernels for s in parsed.steps] == [1, 0]


def test_an_external_id_of_zero_links_nothing() -> None:
    """The profiler writes "External id": 0 for "no linked op": a kernel whose launch is not in
    the trace and whose id is 0 has no step (even with a host event of id 0 in a step)."""
    events = [*_steps(0),
              _x("user_annotation", "setup", 10, 5, **{"External id": 0}),
              _x("cuda_runtime", "cudaLaunchKernel", 20, 1, correlation=1),
              _x("kernel", "linked", 30, 5, stream=7, correlation=1),
              _x("kernel", "unlinked", 1, 2, stream=9, correlation=555, **{"External id": 0})]
    parsed = parse({"traceEvents": events})
    by_name = {a.name: a for a in parsed.activities}
    assert by_name["linked"].step == 0
    assert by_name["unlinked"].step is None and by_name["unlinked"].external_id is None
    assert parsed.attribution["none"] == 1
    assert parsed.steps[0].kernels == 1


def test_back_to_back_ops_are_each_outermost() -> None:
    """An op that starts the microsecond the previous one ended is not nested in it; one that
    starts inside it is."""
    events = [*_steps(0),
              _x("cpu_op", "aten::mm", 20, 10),
              _x("cpu_op", "aten::empty", 21, 1),
              _x("cpu_op", "aten::add", 30, 5),
              _x("cpu_op", "aten::mul", 30, 5, tid=2)]
    parsed = parse({"traceEvents": events})
    assert sorted((op.name, op.tid) for op in parsed.ops) == [
        ("aten::add", "1"), ("aten::mm", "1"), ("aten::mul", "2")]
