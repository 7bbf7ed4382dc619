"""The fused Triton kernels against their torch references; the references against transformers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":  # the interpreter driver: before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm  # noqa: E402

from cadence.model import fused_ops  # noqa: E402
from cadence.model.decoder import CausalLM  # noqa: E402
from cadence.model.rope import RopeParams, RotaryEmbedding  # noqa: E402
from tests.hf_models import LLAMA3_ROPE_SCALING  # noqa: E402
from tests.model.helpers import (  # noqa: E402
    Chunk,
    cuda_args,
    hf_config,
    make_batch,
    new_kv_caches,
)
from tests.model.triton_interpreter import DONE, patch_interpreter, run_interpreted  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]
LLAMA3 = RopeParams(
    theta=500000.0,
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=64,
)
# (q heads, kv heads, head_dim, q/k norm, rope): Qwen3-0.6B, Llama-3 with its scaling, and an
# odd one whose half head_dim is no power of two.
HEAD_CASES = [
    (16, 8, 128, True, RopeParams(theta=1e6)),
    (8, 2, 64, False, LLAMA3),
    (5, 1, 96, True, RopeParams(theta=10000.0)),
]


def _tol(dtype: torch.dtype, atol: float = 2e-2) -> dict[str, float]:
    # bf16: the kernels round once where torch rounds after every op, so results sit about one
    # ulp apart, a little more where RoPE's two products cancel (hence a wider atol there).
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=atol, rtol=2e-2)


def _randn(*shape: int, dtype: torch.dtype, device: str, seed: int, scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


def check_rms_norm(device: str, dtype: torch.dtype, rows: int, width: int) -> None:
    # Rows of a wider buffer: a strided (non-contiguous) input, like a slice of a GEMM output.
    x = _randn(rows, width + 8, dtype=dtype, device=device, seed=0, scale=3.0)[:, :width]
    residual = _randn(rows, width, dtype=dtype, device=device, seed=1)
    weight = 1 + _randn(width, dtype=dtype, device=device, seed=2, scale=0.2)
    eps = 1e-6
    torch.testing.assert_close(
        fused_ops.rms_norm_triton(x, weight, eps),
        fused_ops.rms_norm_reference(x, weight, eps),
        **_tol(dtype),
    )
    normed, new_residual = fused_ops.add_rms_norm_triton(x, residual, weight, eps)
    ref_normed, ref_residual = fused_ops.add_rms_norm_reference(x, residual, weight, eps)
    assert torch.equal(new_residual, ref_residual)  # one add, rounded once: exact
    torch.testing.assert_close(normed, ref_normed, **_tol(dtype))
    assert normed.dtype == dtype and normed.shape == (rows, width)
    # Rows of small magnitude (like a first layer's embeddings): eps is then a large part of the
    # mean square, so a kernel that mishandles it shows. Against a float64 formula.
    small = _randn(rows, width, dtype=dtype, device=device, seed=4, scale=1e-3)
    x64, w64 = small.double(), weight.double()
    expected = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w64
    torch.testing.assert_close(fused_ops.rms_norm_triton(small, weight, eps).double(), expected,
                               **_tol(dtype))


def check_qk_norm_rope(
    device: str, dtype: torch.dtype, rows: int, case: tuple[int, int, int, bool, RopeParams]
) -> None:
    num_heads, num_kv_heads, head_dim, norm, params = case
    max_pos = 4096
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = _randn(rows, q_size + 2 * kv_size, dtype=dtype, device=device, seed=3)
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.view(rows, num_heads, head_dim)
    k = k.view(rows, num_kv_heads, head_dim)
    before = qkv.clone()
    with torch.device(device):
        table = RotaryEmbedding(params, head_dim, max_pos).to(dtype).cos_sin
    gen = torch.Generator().manual_seed(4)
    positions = torch.randint(0, max_pos, (rows,), generator=gen).to(device)
    positions[0] = max_pos - 1
    qw = 1 + _randn(head_dim, dtype=dtype, device=device, seed=5, scale=0.2) if norm else None
    kw = 1 + _randn(head_dim, dtype=dtype, device=device, seed=6, scale=0.2) if norm else None
    ours = fused_ops.qk_norm_rope_triton(q, k, positions, table, qw, kw, 1e-6)
    ref = fused_ops.qk_norm_rope_reference(q, k, positions, table, qw, kw, 1e-6)
    for got, want in zip(ours, ref, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, **_tol(dtype, atol=5e-2))
    assert torch.equal(qkv, before)  # the inputs are left alone
    if norm:
        # Small-magnitude heads: eps is then a large part of each head's mean square; against
        # the reference computed in float64.
        sq, sk = q * 1e-3, k * 1e-3
        small = fused_ops.qk_norm_rope_triton(sq, sk, positions, table, qw, kw, 1e-6)
        wide = fused_ops.qk_norm_rope_reference(sq.double(), sk.double(), positions,
                                                table.double(), qw.double(), kw.double(), 1e-6)
        for got, want in zip(small, wide, strict=True):
            torch.testing.assert_close(got.double(), want, **_tol(dtype, atol=5e-2))


def check_silu_and_mul(device: str, dtype: torch.dtype, rows: int, d: int) -> None:
    gate_up = _randn(rows, 2 * d, dtype=dtype, device=device, seed=7, scale=3.0)
    out = fused_ops.silu_and_mul_triton(gate_up)
    assert out.shape == (rows, d) and out.dtype == dtype
    torch.testing.assert_close(out, fused_ops.silu_and_mul_reference(gate_up), **_tol(dtype))


# --- CPU: the references (the CPU path) are what transformers computes --------------------------


def _rms_norm_f64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def test_rms_norm_of_a_hand_computed_row():
    # rms([3, 4]) = sqrt((9 + 16) / 2) = sqrt(12.5); times the weights [1, 2].
    x = torch.tensor([[3.0, 4.0]])
    w = torch.tensor([1.0, 2.0])
    expected = torch.tensor([[0.8485281374, 2.2627416998]])
    torch.testing.assert_close(fused_ops.rms_norm(x, w, 0.0), expected)
    normed, residual = fused_ops.add_rms_norm(torch.tensor([[1.0, 5.0]]),
                                              torch.tensor([[2.0, -1.0]]), w, 0.0)
    assert residual.tolist() == [[3.0, 4.0]]
    torch.testing.assert_close(normed, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_ops_match_float64_formulas(dtype):
    x = _randn(3, 40, dtype=dtype, device="cpu", seed=0, scale=3.0)
    r = _randn(3, 40, dtype=dtype, device="cpu", seed=1)
    w = 1 + _randn(40, dtype=dtype, device="cpu", seed=2, scale=0.2)
    # float32: a few ulps; bfloat16: rounded after the norm and after the scale (2 x 2^-8).
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1.6e-2)
    got = fused_ops.rms_norm(x, w, 1e-5)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), _rms_norm_f64(x, w, 1e-5), **tol)
    normed, residual = fused_ops.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(residual, r + x)  # one addition, rounded once
    torch.testing.assert_close(normed.double(), _rms_norm_f64(residual, w, 1e-5), **tol)
    g64, u64 = x[:, :20].double(), x[:, 20:].double()
    silu_mul = g64 / (1 + torch.exp(-g64)) * u64
    torch.testing.assert_close(fused_ops.silu_and_mul(x).double(), silu_mul, **tol)


@pytest.mark.parametrize("norm", [True, False])
def test_qk_norm_rope_reference_matches_transformers(norm):
    config = transformers.LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        max_position_embeddings=512,
        rope_theta=500000.0,
        rope_scaling=dict(LLAMA3_ROPE_SCALING),
    )
    table = RotaryEmbedding(RopeParams.from_hf_config(config), 64, 512).cos_sin
    positions = torch.tensor([0, 5, 63, 300, 511])
    q = _randn(5, 4, 64, dtype=torch.float32, device="cpu", seed=0, scale=2.0)
    k = _randn(5, 2, 64, dtype=torch.float32, device="cpu", seed=1, scale=2.0)
    hf_q, hf_k = Qwen3RMSNorm(64, eps=1e-6), Qwen3RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        hf_q.weight.copy_(1 + _randn(64, dtype=torch.float32, device="cpu", seed=2, scale=0.2))
        hf_k.weight.copy_(1 + _randn(64, dtype=torch.float32, device="cpu", seed=3, scale=0.2))
    qw, kw = (hf_q.weight.detach(), hf_k.weight.detach()) if norm else (None, None)
    ours = fused_ops.qk_norm_rope(q, k, positions, table, qw, kw, 1e-6)
    if norm:
        q, k = hf_q(q).detach(), hf_k(k).detach()
    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])
    hq, hk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    torch.testing.assert_close(ours[0], hq[0].transpose(0, 1))
    torch.testing.assert_close(ours[1], hk[0].transpose(0, 1))


@pytest.mark.timeout(600)  # the interpreter's subprocess, minutes on 2 cores
def test_kernels_in_triton_interpreter():
    run_interpreted(__file__)


# --- GPU: each kernel against its reference -----------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,width", [(1, 1024), (7, 1000), (33, 4096), (5, 17)])
def test_rms_norm_kernels(dtype, rows, width):
    check_rms_norm("cuda", dtype, rows, width)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", HEAD_CASES, ids=lambda c: f"h{c[0]}-kv{c[1]}-d{c[2]}")
@pytest.mark.parametrize("rows", [1, 37])
def test_qk_norm_rope_kernel(dtype, case, rows):
    check_qk_norm_rope("cuda", dtype, rows, case)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,d", [(1, 3072), (5, 1000), (64, 17), (2, 14336)])
def test_silu_and_mul_kernel(dtype, rows, d):
    check_silu_and_mul("cuda", dtype, rows, d)


@pytest.mark.gpu
def test_dispatch_on_cuda_runs_the_kernels():
    x = _randn(4, 64, dtype=torch.bfloat16, device="cuda", seed=0)
    w = _randn(64, dtype=torch.bfloat16, device="cuda", seed=1)
    assert torch.equal(fused_ops.rms_norm(x, w, 1e-6), fused_ops.rms_norm_triton(x, w, 1e-6))
    assert torch.equal(fused_ops.silu_and_mul(x), fused_ops.silu_and_mul_triton(x))


def _decode_model(num_layers: int, dtype: torch.dtype) -> tuple[CausalLM, list[torch.Tensor]]:
    from cadence.model.triton_backend import TritonAttentionBackend

    config = hf_config("qwen3", tie=False)
    config.num_hidden_layers = num_layers
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = CausalLM(config, TritonAttentionBackend()).to(dtype)
    model.reset_buffers()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    caches = [c.cuda() for c in new_kv_caches(model, dtype)]
    model.bind_kv_caches(caches)
    return model, caches


@pytest.mark.gpu
def test_decode_graph_is_small_and_replays_the_eager_step():
    from cadence.runtime.graph_launch import graph_kernel_count

    num_layers = 4
    model, caches = _decode_model(num_layers, torch.bfloat16)
    tables = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    prompts = [[3, 4, 5, 6, 7], [9, 10], [11, 12, 13, 14, 15, 16, 17, 18]]
    prefill = make_batch([Chunk(p, 0, t) for p, t in zip(prompts, tables, strict=True)])
    step = make_batch([Chunk([5], len(p), t) for p, t in zip(prompts, tables, strict=True)], 1)
    ids, pos, md = cuda_args(step)
    with torch.no_grad():
        model(*cuda_args(prefill))
        saved = [c.clone() for c in caches]
        eager = model(ids, pos, md).clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model(ids, pos, md)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph):
            captured = model(ids, pos, md)
        graph.instantiate()
        for cache, before in zip(caches, saved, strict=True):
            cache.copy_(before)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(captured[:3], eager[:3])
    kernels = graph_kernel_count(graph.raw_cuda_graph())
    # Per layer: norm, qkv, q/k norm + RoPE, attention (+ split merge), o_proj, add + norm,
    # gate_up, SiLU-and-mul, down; plus the embedding lookup.
    assert kernels <= 11 * num_layers + 2, kernels


if __name__ == "__main__":
    # float32 only: the interpreter rounds bfloat16 differently from the GPU and torch.
    patch_interpreter()
    check_rms_norm("cpu", torch.float32, 7, 1000)
    check_rms_norm("cpu", torch.float32, 2, 17)
    for case in HEAD_CASES:
        check_qk_norm_rope("cpu", torch.float32, 3, case)
    check_silu_and_mul("cpu", torch.float32, 5, 1000)
    print(DONE)
