from __future__ import annotations

from typing import Any

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_torch_capture_replayed_with_cuda_graph_launch(tmp_path: Any) -> None:
    from cadence.runtime import dump_graph_dot, get_device, graph_node_counts, launch_graph

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
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with s.context():
        g.capture_begin(capture_error_mode="thread_local")
        f()
        g.capture_end()
    g.instantiate()
    counts = graph_node_counts(g.raw_cuda_graph())
    assert counts.get("kernel", 0) >= 2, counts
    for _ in range(3):
        with s.context():
            x.normal_()
        launch_graph(g.raw_cuda_graph_exec(), s)
        with s.context():
            want = torch.relu(x @ x.T) * 0.5 + 1.0
        s.synchronize()
        torch.testing.assert_close(out, want)
    text = dump_graph_dot(g.raw_cuda_graph(), tmp_path / "g.dot").read_text()
    assert "digraph" in text
    g.reset()
    s.close()
