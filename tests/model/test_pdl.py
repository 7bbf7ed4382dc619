"""Programmatic dependent launch: off on the CPU and by switch; on the GPU the same bits as
launches without it, eagerly and inside a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from cadence.envs import read_envs
from cadence.model import pdl
from cadence.model.decoder import CausalLM
from tests.model.helpers import Chunk, cuda_args, hf_config, make_batch, new_kv_caches


def test_off_for_cpu_tensors_and_by_switch(monkeypatch):
    assert not pdl.use_pdl(torch.zeros(1))
    monkeypatch.setenv("CADENCE_DISABLE_PDL", "1")
    assert read_envs().disable_pdl
    monkeypatch.delenv("CADENCE_DISABLE_PDL")
    assert not read_envs().disable_pdl


def _set_pdl(monkeypatch, on: bool) -> None:
    monkeypatch.setattr(pdl, "_ENABLED", on)
    monkeypatch.setattr(pdl, "_BY_DEVICE", {})


@pytest.mark.gpu
def test_decode_steps_with_and_without_pdl_agree_bit_for_bit(monkeypatch):
    """A bf16 decode step of three sequences (norms, q/k norm + RoPE, skinny GEMMs, SwiGLU):
    eager and replayed from a graph, with PDL and without."""
    from cadence.model.attention import TorchAttentionBackend

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = CausalLM(hf_config("qwen3", tie=False), TorchAttentionBackend()).to(torch.bfloat16)
    model.reset_buffers()
    caches = [c.cuda() for c in new_kv_caches(model, torch.bfloat16)]
    model.bind_kv_caches(caches)
    tables = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    prompts = [[3, 4, 5, 6, 7], [9, 10], [11, 12, 13, 14, 15, 16, 17, 18]]
    prefill = make_batch([Chunk(p, 0, t) for p, t in zip(prompts, tables, strict=True)])
    step = make_batch([Chunk([5], len(p), t) for p, t in zip(prompts, tables, strict=True)], 1)
    results = {}
    with torch.no_grad():
        model(*cuda_args(prefill))
        saved = [c.clone() for c in caches]
        for on in (False, True):
            _set_pdl(monkeypatch, on)
            assert pdl.use_pdl(caches[0]) == on
            for cache, before in zip(caches, saved, strict=True):
                cache.copy_(before)
            args = cuda_args(step)
            eager = model(*args).clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = model(*args)
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
            results[on] = (eager, out.clone())
    assert torch.equal(results[False][0], results[False][1])
    assert torch.equal(results[True][0], results[False][0])
    assert torch.equal(results[True][1], results[False][0])
