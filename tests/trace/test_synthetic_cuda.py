"""A CUDA trace built by hand with known kernels, durations and gaps: the report's rows,
gaps and bandwidth ratios are exactly those of the construction."""

from __future__ import annotations

import json

import pytest

from cadence.trace.compare import compare
from cadence.trace.floors import ModelShape, op_class
from cadence.trace.kernels import class_table, kernel_table, short_name
from cadence.trace.report import build_figures, render_html
from cadence.trace.steps import parse
from cadence.trace.summary import step_gaps
from nsys.gaps import summarize

GEMM_NAME = "void cutlass::Kernel2<cutlass_80_gemm_64x64>(Params)"
ATTN_NAME = "_decode_kernel"
NORM_NAME = "_rms_norm_kernel"
COPY_NAME = "Memcpy DtoH (Device -> Pinned)"
# Three host steps [0, 100], [100, 200], [200, 300]. On the main stream (7) each step runs, from
# its base: GEMM 8 us, attention 20 us, two norms of 3 us; on the copy stream (20) a 4 us memcpy
# right after. GPU bases 15, 115, 225: busy 38 per step, gaps 115 - 53 = 62 and 225 - 153 = 72.
BASES = (15, 115, 225)
M, K, N = 4, 64, 192  # the GEMM: a [4, 64] input times the qkv weight [192, 64] (bf16)
SHAPE = ModelShape(
    linears={"qkv_proj": [192, 64], "o_proj": [64, 64], "gate_up_proj": [256, 64],
             "down_proj": [64, 128], "lm_head": [100, 64]},
    linear_counts={"qkv_proj": 2, "o_proj": 2, "gate_up_proj": 2, "down_proj": 2, "lm_head": 1},
    num_layers=2, num_kv_heads=2, head_dim=16, dtype_bytes=2,
)
CONTEXT = 100.0  # KV tokens per attention call
BW = 1e12  # bytes/s


def _x(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}
    if args:
        event["args"] = args
    return event


def cuda_trace() -> dict:
    events: list[dict] = []
    corr = 0
    for k, base in enumerate(BASES):
        host = 100 * k
        events.append(_x("user_annotation", "engine_step", host, 100))
        events.append(_x("cpu_op", "schedule", host + 1, 4))
        events.append(_x("cpu_op", "replay", host + 6, 30))
        events.append(_x("cpu_op", "update", host + 60, 30))
        events.append(_x("cuda_runtime", "cudaEventSynchronize", host + 61, 25, correlation=900 + k))
        # The GEMM's launching op, recorded with shapes.
        ext = 10 + k
        events.append(_x("cpu_op", "aten::mm", host + 7, 3, **{
            "External id": ext, "Input Dims": [[M, K], [K, N]],
            "Input type": ["c10::BFloat16", "c10::BFloat16"]}))
        kernels = [(GEMM_NAME, "kernel", base, 8, 7, ext), (ATTN_NAME, "kernel", base + 8, 20, 7, 0),
                   (NORM_NAME, "kernel", base + 28, 3, 7, 0), (NORM_NAME, "kernel", base + 31, 3, 7, 0),
                   (COPY_NAME, "gpu_memcpy", base + 34, 4, 20, 0)]
        for i, (name, cat, start, dur, stream, ext_id) in enumerate(kernels):
            corr += 1
            events.append(_x("cuda_runtime", "cudaLaunchKernel", host + 8 + i, 1, correlation=corr))
            events.append(_x(cat, name, start, dur, correlation=corr, stream=stream,
                             **({"External id": ext_id} if ext_id else {})))
    return {"traceEvents": events}


def test_classes_and_short_names() -> None:
    assert short_name(GEMM_NAME) == "cutlass::Kernel2<cutlass_80_gemm_64x64>"
    assert short_name("void at::native::vectorized_elementwise_kernel<4, at::native::Foo>(int)") \
        == "at::native::vectorized_elementwise_kernel"
    assert [op_class(n) for n in (GEMM_NAME, ATTN_NAME, NORM_NAME, "nvjet_tst_64x8_v_bz_TNN",
                                  "_merge_splits_kernel", "triton_poi_fused_add")] == [
        "gemm", "attention", "norm", "gemm", "attention", "other"]


def test_rows_gaps_and_ratios() -> None:
    parsed = parse(cuda_trace())
    assert [(s.gpu_busy_us, s.kernels, s.memcpys, s.syncs) for s in parsed.steps] == [
        (38, 4, 1, 1)] * 3
    assert step_gaps(parsed) == [(1, 53, 115), (2, 153, 225)]
    rows = {(r.name, r.op): r for r in kernel_table(parsed, SHAPE, BW, CONTEXT)}
    gemm_bytes = 2 * (N * K + M * K + M * N)  # bf16 weight, input and output, once each
    kv_bytes = 2 * 2 * 16 * 2 * CONTEXT  # keys and values: 2 heads x 16 dims, bf16
    expected = {  # (name, op): (calls/step, us/call, bytes/call)
        ("cutlass::Kernel2<cutlass_80_gemm_64x64>", "gemm qkv_proj M=4 N=192 K=64"):
            (1, 8, gemm_bytes),
        (ATTN_NAME, "attention (KV read, est.)"): (1, 20, kv_bytes),
        (NORM_NAME, "norm"): (2, 3, None),
        (COPY_NAME, "memcpy"): (1, 4, None),
    }
    assert set(rows) == set(expected)
    for key, (calls, us, nbytes) in expected.items():
        r = rows[key]
        assert r.calls_per_step == calls and r.us_per_call == us
        assert r.us_per_step == calls * us
        assert r.share == pytest.approx(calls * us / 38)
        assert r.bytes_per_call == nbytes
        if nbytes is None:
            assert r.gbps is None and r.ratio is None
        else:
            assert r.gbps == pytest.approx(nbytes / (us * 1e-6) / 1e9)
            assert r.ratio == pytest.approx(nbytes / (us * 1e-6) / BW)
    order = [r.name for r in kernel_table(parsed, SHAPE, BW, CONTEXT)]
    assert order == [ATTN_NAME, "cutlass::Kernel2<cutlass_80_gemm_64x64>", NORM_NAME, COPY_NAME]


def test_class_totals() -> None:
    parsed = parse(cuda_trace())
    classes = {c["class"]: c for c in class_table(kernel_table(parsed, SHAPE, BW, CONTEXT),
                                                  SHAPE, BW)}
    assert set(classes) == {"gemm", "attention", "norm", "memcpy"}
    assert classes["gemm"]["bytes_per_step"] == 2 * (N * K + M * K + M * N)
    assert classes["norm"]["bytes_per_step"] is None and classes["norm"]["us_per_step"] == 6
    # A graph replay: no shapes, so GEMMs are floored by the model's linear weights.
    trace = cuda_trace()
    for e in trace["traceEvents"]:
        (e.get("args") or {}).pop("External id", None)
    rows = kernel_table(parse(trace), SHAPE, BW, CONTEXT)
    gemm = next(c for c in class_table(rows, SHAPE, BW) if c["class"] == "gemm")
    weights = 2 * (2 * (192 * 64 + 64 * 64 + 256 * 64 + 64 * 128) + 100 * 64)
    assert SHAPE.weight_bytes == weights
    assert gemm["bytes_source"] == "model weights" and gemm["bytes_per_step"] == weights
    assert gemm["gbps"] == pytest.approx(weights / 8e-6 / 1e9)
    assert gemm["ratio"] == pytest.approx(weights / 8e-6 / BW)


def test_figures_match_gaps_and_render(tmp_path) -> None:
    trace = cuda_trace()
    parsed = parse(trace)
    run = {"model_shape": SHAPE.to_json(), "context_tokens": CONTEXT}
    figures = build_figures(parsed, run, BW, "synthetic")
    gaps = summarize(trace)
    assert figures["summary"] == gaps
    assert gaps["gaps_us"] == [62, 72]
    assert gaps["gpu_idle_fraction"] == pytest.approx(1 - 3 * 38 / (263 - 15))
    assert figures["reference_us_per_step"] == 38
    assert figures["rows_share"] == pytest.approx(1.0)  # nothing overlaps within a step
    json.dumps(figures)  # JSON-ready
    page = render_html(figures, parsed, 3)
    assert page.count("data:image/png;base64,") == 2
    assert 'id="kernels"' in page and "gemm qkv_proj M=4 N=192 K=64" in page


def test_compare_deltas() -> None:
    parsed = parse(cuda_trace())
    this = build_figures(parsed, {"model_shape": SHAPE.to_json(), "context_tokens": CONTEXT}, BW)
    slower = cuda_trace()
    for e in slower["traceEvents"]:
        if e["name"] == ATTN_NAME:
            e["dur"] = 40  # attention 20 us slower: it runs past the norms and the memcpy
    other = build_figures(parse(slower), {"model_shape": SHAPE.to_json(),
                                          "context_tokens": CONTEXT}, BW)
    cmp = compare(this, other)
    by_name = {r["name"]: r for r in cmp["kernels"]}
    assert by_name[ATTN_NAME]["delta_us_per_step"] == -20
    assert by_name[NORM_NAME]["delta_us_per_step"] == 0
    assert cmp["kernels"][0]["name"] == ATTN_NAME  # largest change first
    steps = {s["figure"]: s for s in cmp["steps"]}
    assert steps["gpu_busy_us p50"]["delta"] == 38 - 48  # [b, b+38] became [b, b+48]
    assert steps["host_us p50"]["delta"] == 0


def test_host_op_floors_on_a_cpu_trace() -> None:
    """CPU-only: rows are the outermost host ops; a GEMM with a bias and a norm with shapes get
    their floors, nested ops and phase ranges are not rows."""
    events = [_x("user_annotation", "engine_step", 0, 100), _x("user_annotation", "engine_step", 100, 100)]
    for base in (0, 100):
        events += [
            _x("cpu_op", "forward", base + 5, 80),
            _x("cpu_op", "aten::addmm", base + 10, 20, **{
                "Input Dims": [[192], [4, 64], [64, 192]], "Input type": ["float", "float", "float"]}),
            _x("cpu_op", "aten::mm", base + 12, 10),  # nested in the addmm: not a row
            _x("cpu_op", "aten::rms_norm", base + 40, 5, **{
                "Input Dims": [[4, 64], [64], []], "Input type": ["c10::Half", "c10::Half", "Scalar"]}),
            _x("cpu_op", "aten::cat", base + 50, 5, **{"Input Dims": [[[4, 64], [4, 64]], []]}),
        ]
    parsed = parse({"traceEvents": events})
    assert not parsed.has_gpu and [r.name for r in parsed.phases] == ["forward", "forward"]
    rows = {r.name: r for r in kernel_table(parsed, SHAPE, BW)}
    assert set(rows) == {"aten::addmm", "aten::rms_norm", "aten::cat"}
    addmm = rows["aten::addmm"]
    assert addmm.op == "gemm qkv_proj M=4 N=192 K=64"
    assert addmm.bytes_per_call == 4 * (192 * 64 + 4 * 64 + 4 * 192 + 192)  # float, with bias
    assert addmm.share == pytest.approx(20 / 100)  # of the mean host step
    norm = rows["aten::rms_norm"]
    assert norm.op == "norm [4, 64]" and norm.bytes_per_call == 2 * (2 * 4 * 64 + 64)  # fp16
    assert norm.gbps == pytest.approx(norm.bytes_per_call / 5e-6 / 1e9)
    assert rows["aten::cat"].bytes_per_call is None
