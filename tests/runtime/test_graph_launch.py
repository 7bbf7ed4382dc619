"""Graphs as objects: ``with stream.capture() as graph`` on a real device, and the raw helpers."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_capture_replays_with_new_inputs_and_can_be_inspected(tmp_path: Any) -> None:
    from cadence.runtime import Graph, get_device

    dev = get_device("cuda")
    s = dev.create_stream()
    x = torch.randn(64, 64, device="cuda")
    out = torch.empty_like(x)
    torch.cuda.synchronize()

    def f() -> None:
        out.copy_(torch.relu(x @ x.T) * 0.5 + 1.0)

    with s.context():
        f()  # warm-up (cuBLAS handles, workspaces)
    s.synchronize()
    with s.capture() as g:
        f()
    assert isinstance(g, Graph)
    counts = g.node_counts()
    assert g.kernel_count == counts.get("kernel", 0) >= 2, counts
    for _ in range(3):
        with s.context():
            x.normal_()
        g.launch(s)
        with s.context():
            want = torch.relu(x @ x.T) * 0.5 + 1.0
        s.synchronize()
        torch.testing.assert_close(out, want)
    assert "digraph" in g.to_dot(tmp_path / "g.dot").read_text()

    # A second graph shares the first one's memory pool.
    with s.capture(pool=g.pool) as g2:
        y = x * 2.0
    g2.launch(s)
    s.synchronize()
    torch.testing.assert_close(y, x * 2.0)
    g2.close()
    g.close()
    with pytest.raises(ValueError, match="closed"):
        g.launch(s)
    s.close()


def test_a_failing_capture_leaves_the_stream_usable() -> None:
    from cadence.runtime import get_device

    dev = get_device("cuda")
    s = dev.create_stream()
    x = torch.ones(16, device="cuda")
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="boom"), s.capture():
        x.add_(1)
        raise RuntimeError("boom")
    with s.context():
        x.add_(1)
    s.synchronize()
    assert float(x[0]) == 2.0  # the captured add never ran; the eager one did
    s.close()


def test_raw_helpers_on_a_captured_graph(tmp_path: Any) -> None:
    from cadence.runtime import dump_graph_dot, get_device, graph_node_counts, launch_graph

    dev = get_device("cuda")
    s = dev.create_stream()
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    with s.capture() as g:
        x.add_(1)
    launch_graph(g.exec_handle, s)
    s.synchronize()
    assert float(x[0]) == 1.0
    assert graph_node_counts(g.handle).get("kernel", 0) == 1
    assert "digraph" in dump_graph_dot(g.handle, tmp_path / "raw.dot").read_text()
    g.close()
    s.close()
