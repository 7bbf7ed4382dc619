"""Programmatic dependent launches on the GPU: a decode step gives the same bits with them as
without, eagerly and replayed from a CUDA graph (the switch and the launch option are tested on
the CPU in tests/runtime/test_triton_launch.py)."""

from __future__ import annotations

import pytest
import torch

from cadence.model.decoder import CausalLM
from cadence.runtime import triton_launch
from tests.model.helpers import Chunk, cuda_args, hf_config, make_batch, new_kv_caches


@pytest.mark.gpu
@pytest.mark.parametrize("sequences", [1, 3], ids=["one (the MLP block)", "three"])
def test_decode_steps_with_and_without_pdl_agree_bit_for_bit(monkeypatch, sequences):
    """A bf16 decode step through the Triton backend: the skinny projections with their fused
    norms, decode attention split over the context with its merge, and at one sequence the
    MLP block; PDL off, then on, eager and from a graph (the graph replayed several times, so
    that steps follow each other as in serving)."""
    from cadence.model.triton_backend import TritonAttentionBackend

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launches need compute capability 9.0")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = CausalLM(hf_config("qwen3", tie=False),
                         TritonAttentionBackend(num_sms=132)).to(torch.bfloat16)
    model.reset_buffers()
    caches = [c.cuda() for c in new_kv_caches(model, torch.bfloat16)]
    model.bind_kv_caches(caches)
    tables = [[1, 2, 3], [4, 5, 6], [7, 8, 9]][:sequences]
    prompts = [[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [9, 10], [11, 12, 13, 14, 15, 16]]
    prefill = make_batch([Chunk(p, 0, t) for p, t in zip(prompts, tables)])
    # One sequence with no padding row: a one-token step, which the MLP block takes.
    step = make_batch([Chunk([5], len(p), t) for p, t in zip(prompts, tables)],
                      0 if sequences == 1 else 1)
    index = torch.cuda.current_device()
    results = {}
    with torch.no_grad():
        model(*cuda_args(prefill))
        saved = [c.clone() for c in caches]
        for on in (False, True):
            monkeypatch.setattr(triton_launch, "_PDL", {index: on})
            assert triton_launch.pdl_enabled(caches[0].device) is on
            for cache, before in zip(caches, saved, strict=True):
                cache.copy_(before)
            args = cuda_args(step)
            eager = model(*args).clone()
            eager_cache = [c.clone() for c in caches]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = model(*args)
            for _ in range(5):
                graph.replay()
            torch.cuda.synchronize()
            results[on] = (eager, out.clone(), eager_cache, [c.clone() for c in caches])
    off, on = results[False], results[True]
    assert torch.equal(off[0], off[1])  # graphs == eager without PDL: the baseline holds
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[0])
    for got, want in zip(on[2] + on[3], off[2] + off[3], strict=True):
        assert torch.equal(got.nan_to_num(), want.nan_to_num())  # the K/V written alike
