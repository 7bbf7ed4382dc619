"""The per-kernel and per-class tables, the HTML page's parts and the pictures' contents, on the
hand-built CUDA trace of ``test_synthetic_cuda`` (three steps, GPU busy 38 us each)."""

from __future__ import annotations

import pytest

from cadence.trace import plots, report
from cadence.trace.compare import compare
from cadence.trace.kernels import class_table, kernel_table, short_name
from cadence.trace.report import build_figures, render_html
from cadence.trace.steps import parse
from cadence.trace.summary import summarize
from tests.nsys.test_gaps import synthetic_trace
from tests.trace.test_synthetic_cuda import (
    ATTN_NAME,
    BASES,
    BW,
    CONTEXT,
    NORM_NAME,
    SHAPE,
    _x,
    cuda_trace,
)

NVJET = "nvjet_tst_64x8_v_bz_TNN"  # a GEMM launched by a graph replay: no shapes, no floor
RUN = {"model_shape": SHAPE.to_json(), "context_tokens": CONTEXT}


def _with_more_work() -> dict:
    """The synthetic trace plus, per step, a 6 us shapeless GEMM on stream 3 and a 2 us memset
    on the copy stream; and a kernel launched before the first step (in no step)."""
    trace = cuda_trace()
    events = trace["traceEvents"]
    for k, base in enumerate(BASES):
        corr = 500 + 2 * k
        events.append(_x("cuda_runtime", "cudaLaunchKernel", 100 * k + 50, 1, correlation=corr))
        events.append(_x("kernel", NVJET, base + 38, 6, correlation=corr, stream=3))
        events.append(_x("cuda_runtime", "cudaMemsetAsync", 100 * k + 51, 1,
                         correlation=corr + 1))
        events.append(_x("gpu_memset", "Memset (Device)", base + 44, 2, correlation=corr + 1,
                         stream=20))
    events.append(_x("cuda_runtime", "cudaLaunchKernel", -50, 1, correlation=999))
    events.append(_x("kernel", "stray_kernel", -40, 500, correlation=999, stream=7))
    return trace


def test_a_long_name_is_cut_to_the_limit() -> None:
    name = "ns::" + "x" * 100
    short = short_name(name)
    assert len(short) == 64 and short == name[:63] + "\u2026"
    assert short_name(name, limit=200) == name


def test_rows_tie_by_name_and_classes_sort_by_time() -> None:
    parsed = parse(_with_more_work())
    rows = kernel_table(parsed, SHAPE, BW, CONTEXT)
    # The stray kernel ran before every step: no row, and no time in any step.
    assert "stray_kernel" not in {r.name for r in rows}
    # The norms (2 x 3 us) and the shapeless GEMM (6 us) tie: by name, "_" before "n".
    assert [(r.name, r.us_per_step) for r in rows] == [
        (ATTN_NAME, 20), ("cutlass::Kernel2<cutlass_80_gemm_64x64>", 8), (NORM_NAME, 6),
        (NVJET, 6), ("Memcpy DtoH (Device -> Pinned)", 4), ("Memset (Device)", 2)]
    classes = class_table(rows, SHAPE, BW)
    assert [(c["class"], c["us_per_step"], c["kernels"]) for c in classes] == [
        ("attention", 20, 1), ("gemm", 14, 2), ("norm", 6, 1), ("memcpy", 4, 1),
        ("memset", 2, 1)]
    gemm = classes[1]
    # Only the shaped GEMM has a floor: its bytes over its own 8 us, not the class's 14.
    nbytes = 2 * (192 * 64 + 4 * 64 + 4 * 192)
    assert gemm["bytes_per_step"] == nbytes and gemm["floored_us_per_step"] == 8
    assert gemm["bytes_source"] == "1 of 2 rows"
    assert gemm["gbps"] == pytest.approx(nbytes / 8e-6 / 1e9)


def _page(monkeypatch, trace: dict, title: str = "synthetic", **kw) -> tuple[str, list]:
    shown: list[tuple[int, int]] = []
    monkeypatch.setattr(report, "timeline_png",
                        lambda parsed, first, count: shown.append((first, count)) or "")
    parsed = parse(trace)
    figures = build_figures(parsed, RUN, BW, title)
    return render_html(figures, parsed, **kw), shown


def test_the_page_shows_percentages_bandwidth_and_escaped_names(monkeypatch) -> None:
    page, _ = _page(monkeypatch, cuda_trace(), title="<b>run</b>")
    assert "<td>52.6%</td>" in page  # attention: 20 of 38 us
    assert "Read bandwidth for the floors: 1.00 TB/s." in page
    assert "cutlass::Kernel2&lt;cutlass_80_gemm_64x64&gt;</span>" in page
    assert "<b>run</b>" not in page and page.count("&lt;b&gt;run&lt;/b&gt;") == 2


def test_the_attention_floor_takes_the_runs_context() -> None:
    figures = build_figures(parse(cuda_trace()), RUN, BW)
    attention = next(r for r in figures["kernels"] if r["name"] == ATTN_NAME)
    assert attention["bytes_per_call"] == 2 * 2 * 16 * 2 * CONTEXT  # K and V, bf16


def test_max_rows_and_the_timelines_first_step(monkeypatch) -> None:
    page, shown = _page(monkeypatch, cuda_trace(), timeline_steps=2, max_rows=2)
    table = page.split('<table id="kernels">')[1].split("</table>")[0]
    assert table.count("<tr>") == 1 + 2
    assert "2 shorter rows are in the JSON figures." in page
    # More steps than shown: the first (filling the pipeline) is skipped; as many: kept.
    _, shown_all = _page(monkeypatch, cuda_trace(), timeline_steps=3)
    assert shown == [(1, 2)] and shown_all == [(0, 3)]


def test_the_comparison_table_is_this_then_other(monkeypatch) -> None:
    slower = cuda_trace()
    for e in slower["traceEvents"]:
        if e["name"] == ATTN_NAME:
            e["dur"] = 40
    parsed = parse(cuda_trace())
    this = build_figures(parsed, RUN, BW)
    this["compare"] = compare(this, build_figures(parse(slower), RUN, BW))
    monkeypatch.setattr(report, "timeline_png", lambda *a: "")
    page = render_html(this, parsed)
    assert f'<td class="l">{ATTN_NAME}</td>' in page
    assert "<td>20.0</td><td>40.0</td><td>-20.0</td>" in page


def test_stream_names() -> None:
    names = plots.stream_names(parse(_with_more_work()))
    # Stream 7 has the most kernels; 20 only copies and sets; 3 runs kernels too.
    assert list(names.items()) == [("7", "GPU main (stream 7)"), ("20", "GPU copy (stream 20)"),
                                   ("3", "GPU stream 3")]


@pytest.fixture
def figs(monkeypatch) -> list:
    made: list = []
    monkeypatch.setattr(plots, "_png", lambda fig: made.append(fig) or "")
    yield made
    for fig in made:
        plots._plt().close(fig)


def test_the_timeline_shows_the_chosen_steps(figs) -> None:
    parsed = parse(cuda_trace())
    plots.timeline_png(parsed, 1, 1)
    ax = figs[0].axes[0]
    assert ax.get_title() == "steps 1..1"
    spans = {label.get_text(): len(c.get_paths()) for label, c in
             zip(ax.get_yticklabels(), ax.collections)}
    # Step 1: its host range, three phases, four kernels on the main stream, one memcpy.
    assert spans == {"GPU copy (stream 20)": 1, "GPU main (stream 7)": 4, "host: phases": 3,
                     "host: engine_step": 1}
    assert len(ax.patches) == 1  # the gap before step 1, not the one before step 2
    plots.timeline_png(parsed, 0, 3)
    assert figs[1].axes[0].get_title() == "steps 0..2"


def test_the_timeline_reaches_the_last_gpu_work(figs) -> None:
    # Step 0 of the gaps trace: host [0, 100], its last kernel runs to 105 us.
    plots.timeline_png(parse(synthetic_trace()), 0, 1)
    assert figs[0].axes[0].get_xlim() == pytest.approx((0, 0.105 * 1.01))


def test_the_histograms_count_kernels_per_step(figs) -> None:
    plots.histograms_png(summarize(parse(cuda_trace())))
    ax = next(a for a in figs[0].axes if a.get_title() == "kernels per step")
    # Four kernels in each of the three steps: one bar of 3 steps, centered on 4.
    assert [(p.get_x() + p.get_width() / 2, p.get_height()) for p in ax.patches] == [(4, 3)]
