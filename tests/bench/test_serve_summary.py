"""``cadence bench serve``'s summary: throughputs and token totals count completed requests."""

from __future__ import annotations

from cadence.bench import serve as bench_serve


def test_throughputs_and_token_totals_leave_failed_requests_out() -> None:
    R = bench_serve.RequestResult
    results = [
        R(ok=True, prompt_len=10, output_tokens=4, ttft=0.1, latency=0.4, itl=[0.1] * 3),
        R(ok=True, prompt_len=20, output_tokens=6, ttft=0.2, latency=0.7, itl=[0.1] * 5),
        R(ok=False, prompt_len=100, error="HTTP 500"),  # its prompt was sent, nothing came
    ]
    report = bench_serve.summarize(results, duration=2.0, concurrency=None)
    assert (report["completed"], report["failed"]) == (2, 1)
    assert report["total_input_tokens"] == 30  # 10 + 20
    assert report["total_output_tokens"] == 10  # 4 + 6
    assert report["request_throughput"] == 1.0  # 2 completed in 2 s
    assert report["output_throughput"] == 5.0  # 10 tokens in 2 s
    assert report["total_token_throughput"] == 20.0  # (30 + 10) tokens in 2 s


def test_a_run_of_no_duration_has_zero_throughputs() -> None:
    report = bench_serve.summarize([bench_serve.RequestResult(ok=False, prompt_len=3,
                                                              error="refused")], 0.0, 1)
    assert (report["request_throughput"], report["output_throughput"],
            report["total_token_throughput"], report["total_input_tokens"]) == (0.0, 0.0, 0.0, 0)
