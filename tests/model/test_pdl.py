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
    # Only the sequences' rows: the padding row of the three-sequence step is an empty query
    # whose logits no one reads (they differ between an eager pass and a graph, PDL or not).
    off = [t[:sequences] for t in results[False][:2]] + list(results[False][2:])
    on = [t[:sequences] for t in results[True][:2]] + list(results[True][2:])
    assert torch.equal(off[0], off[1])  # graphs == eager without PDL: the baseline holds
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[0])
    for got, want in zip(on[2] + on[3], off[2] + off[3], strict=True):
        assert torch.equal(got.nan_to_num(), want.nan_to_num())  # the K/V written alike


# --- CPU: the PTX a GPU would run, compiled for sm_90 (Triton's own ptxas, no device) ----------

_FLOATS = {"eps", "qk_scale", "cap_scale", "v_scale", "k_inv", "v_inv"}
_INT_PTRS = {"count_ptr", "slot_ptr", "seq_lens_ptr", "qsl_ptr", "bt_ptr", "pos_ptr"}
_F32_PTRS = {"part_ptr", "part_acc_ptr", "part_ml_ptr", "cs_ptr"}


def _ptx(kernel, constexprs: dict, num_warps: int, cooperative: bool = False) -> list[str]:
    """The memory and grid-dependency instructions of ``kernel`` compiled for sm_90 with
    ``constexprs``, in program order."""
    import re

    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = ("*i32" if name in _INT_PTRS else "*fp32" if name in _F32_PTRS
                               else "*bf16")
        else:
            signature[name] = "fp32" if name in _FLOATS else "i32"
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    options = {"num_warps": num_warps, "launch_pdl": True}
    if cooperative:
        options["launch_cooperative_grid"] = True
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    pattern = re.compile(r"\s*(@%p\d+\s+)?(griddepcontrol\.\w+|ld\.global|st\.global|atom)")
    return [m.group(2) for line in compiled.asm["ptx"].splitlines()
            if (m := pattern.match(line))]


def _wait_first(ops: list[str], released_first: bool = False) -> None:
    """The wait comes before any memory instruction; with ``released_first`` the next kernel
    is let launch before it (nothing else before), otherwise at some point after it."""
    head = (["griddepcontrol.launch_dependents", "griddepcontrol.wait"] if released_first
            else ["griddepcontrol.wait"])
    assert ops[:len(head)] == head, ops[:4]
    assert ops.count("griddepcontrol.launch_dependents") == 1


@pytest.mark.timeout(600)  # six compilations, ~10 s each on 2 cores
def test_pdl_kernels_wait_before_they_touch_memory():
    """Each kernel's first memory instruction comes after its grid-dependency wait (the decode
    attention pair lets its next kernel launch before that wait, the others after); the MLP
    block only loads (its first weight tile) before it, and lets the next kernel launch only
    after its two grid barriers."""
    from cadence.model.mlp_block_triton import _mlp_block_kernel
    from cadence.model.skinny_gemm_triton import _skinny_gemm_kernel
    from cadence.model.triton_decode_early import _decode_early_kernel
    from cadence.model.triton_decode_kernels import _decode_kernel, _merge_splits_kernel

    if _decode_kernel is None:
        pytest.skip("triton is not installed")
    # The attention pair lets the o projection launch first, so that its weights stream
    # while attention runs.
    _wait_first(_ptx(_merge_splits_kernel, dict(NUM_HEADS=16, HEAD_DIM=128, BLOCK_S=4,
                                                BLOCK_D=128, PDL=True), 2), released_first=True)
    _wait_first(_ptx(_decode_kernel, dict(
        NUM_HEADS=16, GROUP=2, HEAD_DIM=128, PAGE=16, BLOCK_G=16, BLOCK_D=128, BLOCK_N=64,
        SPLIT=True, STORE=True, SLIDING=False, SOFTCAP=False, IEEE=False, FP8=False, ROPE=True,
        QK_NORM=True, PDL=True), 4), released_first=True)
    # The early-load kernel requests the step's metadata and the cached keys of earlier tokens
    # before its wait (no kernel of the step writes them) and writes nothing before it.
    early = _ptx(_decode_early_kernel, dict(
        NUM_HEADS=16, GROUP=2, HEAD_DIM=128, PAGE=16, BLOCK_G=16, BLOCK_D=128, BLOCK_N=64,
        SPLIT=True, SLIDING=False, SOFTCAP=False, IEEE=False, FP8=False, ROPE=True, QK_NORM=True,
        PDL=True), 4)
    wait = early.index("griddepcontrol.wait")
    assert early[0] == "griddepcontrol.launch_dependents"
    assert wait > 1 and set(early[1:wait]) == {"ld.global"}
    assert early.count("griddepcontrol.launch_dependents") == 1
    for late in (False, True):  # the exact fused norm's and the late norm's launches
        _wait_first(_ptx(_skinny_gemm_kernel, dict(
            BLOCK_M=1, BLOCK_N=64, BLOCK_K=128, DOT=False, SPLIT=True, EVEN_K=True,
            HAS_BIAS=False, GLU=False, NORM=True, HAS_RES=True, NORM_ROWS=1, NORM_CHUNK=1024,
            NORM_LATE=late, PDL=True), 4))
    block = _ptx(_mlp_block_kernel, dict(ROWS=8, BLOCK_Q=2048, BLOCK_H=1024, BLOCK_I=4096,
                                         NORM_CHUNK=1024, PHASE=-1, PDL=True), 8,
                 cooperative=True)
    wait = block.index("griddepcontrol.wait")
    assert wait > 0 and set(block[:wait]) == {"ld.global"}  # the o_proj tile's loads only
    trigger = block.index("griddepcontrol.launch_dependents")
    assert block[wait:trigger].count("atom") >= 2  # both barriers' arrivals come first
