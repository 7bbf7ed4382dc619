"""The skinny GEMM kernel against float64 references, its dispatch, and the decoder's use of it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":  # the interpreter driver: before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from cadence.envs import read_envs  # noqa: E402
from cadence.model import skinny_gemm, skinny_gemm_kernels  # noqa: E402
from cadence.model.decoder import CausalLM  # noqa: E402
from cadence.model.skinny_gemm import (  # noqa: E402
    SkinnyConfig,
    SkinnyLinear,
    heuristic_config,
    skinny_linear,
    use_skinny_gemm,
)
from cadence.model.skinny_gemm_kernels import (  # noqa: E402
    MAX_COUNTERS,
    launch_shape,
    row_bucket,
    skinny_matmul,
)
from tests.model.helpers import hf_config  # noqa: E402
from tests.model.triton_interpreter import DONE, patch_interpreter, run_interpreted  # noqa: E402

# One configuration per code path: tensor cores and float32 multiply-adds, each unsplit and
# split over K (tiles chosen small so that the small shapes below split and leave remainders).
SMALL_CONFIGS = [
    SkinnyConfig(block_n=16, block_k=32, split_k=1, dot=True),
    SkinnyConfig(block_n=32, block_k=16, split_k=4, dot=True),
    SkinnyConfig(block_n=8, block_k=64, split_k=1, num_warps=4, num_stages=1, dot=False),
    SkinnyConfig(block_n=16, block_k=32, split_k=3, num_warps=4, num_stages=1, dot=False),
]
# (M, N, K): none of N and K a multiple of the blocks except the first.
SMALL_SHAPES = [(1, 64, 128), (3, 40, 100), (16, 33, 70), (5, 17, 300)]

QWEN3_06B = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
LLAMA3_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
             "down": (4096, 14336)}  # fmt: skip
QWEN3_30B_A3B = {"qkv": (5120, 2048), "o": (2048, 4096)}  # attention; the MLP is the experts
REAL_SHAPES = [(f"qwen3-0.6b-{k}", *v) for k, v in QWEN3_06B.items()] + [
    (f"llama3-8b-{k}", *v) for k, v in LLAMA3_8B.items()
] + [(f"qwen3-30b-a3b-{k}", *v) for k, v in QWEN3_30B_A3B.items()]


def _operands(m: int, n: int, k: int, dtype: torch.dtype, device: str, seed: int = 0,
              bias: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Outputs of about unit size: x ~ N(0, 1), W ~ N(0, 1 / K)."""
    gen = torch.Generator(device).manual_seed(seed)
    x = torch.randn(m, k, generator=gen, device=device).to(dtype)
    w = (torch.randn(n, k, generator=gen, device=device) / k**0.5).to(dtype)
    b = torch.randn(n, generator=gen, device=device).to(dtype) if bias else None
    return x, w, b


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ w.double().T
    return out if b is None else out + b.double()


def _tol(dtype: torch.dtype) -> dict[str, float]:
    # Half precisions: one rounding of the output (float32 sums inside).
    return {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3),
            torch.bfloat16: dict(atol=1.6e-2, rtol=1e-2)}[dtype]  # fmt: skip


def check_kernel(device: str, dtype: torch.dtype, m: int, n: int, k: int,
                 cfg: SkinnyConfig) -> None:
    x, w, b = _operands(m, n, k, dtype, device, seed=m * 1000 + n + k)
    for bias in (b, None):
        out = skinny_matmul(x, w, bias, cfg)
        assert out.shape == (m, n) and out.dtype == dtype
        torch.testing.assert_close(out.double(), _reference(x, w, bias), **_tol(dtype))
    # Rows of a wider buffer (a row stride other than K), and the same bits on a second call.
    wide = torch.zeros(m, k + 8, dtype=dtype, device=device)
    wide[:, :k] = x
    again = skinny_matmul(wide[:, :k], w, b, cfg)
    assert torch.equal(again, skinny_matmul(x, w, b, cfg))
    # Each row's bits do not depend on the other rows of its bucket.
    if m > 1 and row_bucket(m - 1) == row_bucket(m):
        assert torch.equal(skinny_matmul(x[:-1], w, b, cfg), again[:-1])
    counters = skinny_gemm_kernels._SCRATCH[x.device.index][0]
    assert int(counters.count_nonzero()) == 0  # every split launch put its counters back


def check_glu(device: str, dtype: torch.dtype, m: int, n: int, k: int,
              cfg: SkinnyConfig) -> None:
    """SwiGLU in the kernel's loads gives the bits of the SwiGLU kernel, then the GEMM."""
    from cadence.model.fused_ops import silu_and_mul_triton

    gen = torch.Generator(device).manual_seed(m + n + k)
    gate_up = torch.randn(m, 2 * k, generator=gen, device=device).to(dtype)
    _, w, b = _operands(m, n, k, dtype, device, seed=m + n + k + 1)
    h = silu_and_mul_triton(gate_up)
    for bias in (b, None):
        assert torch.equal(skinny_matmul(gate_up, w, bias, cfg, glu=True),
                           skinny_matmul(h, w, bias, cfg))
    with pytest.raises(ValueError, match="does not fit"):
        skinny_matmul(h, w, b, cfg, glu=True)


def run_interpreter_cases() -> None:
    for cfg in SMALL_CONFIGS:
        for m, n, k in SMALL_SHAPES:
            check_kernel("cpu", torch.float32, m, n, k, cfg)
            check_kernel("cpu", torch.float16, m, n, k, cfg)
            if not cfg.dot:  # the interpreter's tl.dot does not take bfloat16
                check_kernel("cpu", torch.bfloat16, m, n, k, cfg)
                check_glu("cpu", torch.bfloat16, m, n, k, cfg)
            check_glu("cpu", torch.float32, m, n, k, cfg)


# --- CPU ----------------------------------------------------------------------------------------


@pytest.mark.timeout(600)  # the interpreter's subprocess, minutes on 2 cores
def test_kernels_in_triton_interpreter():
    run_interpreted(__file__)


def test_row_buckets():
    assert [row_bucket(r) for r in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 4, 4, 4, 8, 8, 16, 16]


@pytest.mark.parametrize("k", [64, 100, 1024, 3072, 14336])
@pytest.mark.parametrize("split", [1, 2, 3, 7, 64])
def test_launch_shape_covers_k_with_no_empty_slice(k, split):
    cfg = SkinnyConfig(block_n=32, block_k=128, split_k=split)
    shape = launch_shape(4, 1000, k, cfg)
    assert shape.column_blocks == 32 and shape.block_m == 16
    assert shape.k_per_split % cfg.block_k == 0
    assert (shape.split_k - 1) * shape.k_per_split < k <= shape.split_k * shape.k_per_split
    assert 1 <= shape.split_k <= split
    fma = launch_shape(3, 1000, k, SkinnyConfig(block_n=32, block_k=128, split_k=split, dot=False))
    assert fma.block_m == 4


def test_launch_shape_runs_unsplit_past_the_counters():
    cfg = SkinnyConfig(block_n=1, block_k=16, split_k=4)
    assert launch_shape(1, MAX_COUNTERS + 1, 64, cfg).split_k == 1
    assert launch_shape(1, MAX_COUNTERS, 64, cfg).split_k == 4


@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("n,k", [(1024, 3072), (28672, 4096), (8, 16)])
def test_heuristic_config_is_launchable(rows, n, k):
    cfg = heuristic_config(rows, n, k, num_sms=132)
    shape = launch_shape(rows, n, k, cfg)
    assert 1 <= shape.split_k <= -(-k // cfg.block_k)
    if shape.column_blocks < 4 * 132 and k >= 8 * cfg.block_k:
        assert shape.split_k > 1  # few column blocks: K is split to fill the SMs


def test_choice_of_table_heuristic_or_cublas(monkeypatch):
    class Props:
        multi_processor_count = 132

    capability = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability[0])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props())
    listed = SkinnyConfig(block_n=16, block_k=512, split_k=2, num_warps=8, num_stages=1, dot=False)
    monkeypatch.setattr(skinny_gemm, "SKINNY_CONFIGS",
                        {(28672, 4096, 1): listed, (4096, 1024, 4): None})

    def choose(n: int, k: int, bucket: int) -> SkinnyConfig | None:
        monkeypatch.setattr(skinny_gemm, "_CHOSEN", {})
        return skinny_gemm._choose(torch.device("cuda", 0), n, k, bucket)

    assert choose(4096, 1024, 1) == heuristic_config(1, 4096, 1024, 132)  # 8 MB: unlisted
    assert choose(4096, 1024, 4) is None  # listed: cuBLAS wins
    assert choose(28672, 4096, 1) == listed
    assert choose(28672, 4096, 4) is None  # 235 MB, unlisted: cuBLAS
    capability[0] = (8, 0)  # not the table's device: sizes alone decide
    assert choose(28672, 4096, 1) is None
    assert choose(4096, 1024, 4) == heuristic_config(4, 4096, 1024, 132)
    capability[0] = (7, 5)
    assert choose(4096, 1024, 1) is None


@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 64), (17, 64)])
def test_cpu_forward_is_nn_linear(shape):
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    skinny = nn.Linear(64, 48)
    skinny.load_state_dict(linear.state_dict())
    skinny.__class__ = SkinnyLinear
    x = torch.randn(*shape)
    assert torch.equal(skinny(x), linear(x))
    xb, wb = x.bfloat16(), linear.weight.bfloat16()
    assert torch.equal(skinny_linear(xb, wb), F.linear(xb, wb))


def test_cpu_glu_forward_is_swiglu_then_linear():
    from cadence.model.fused_ops import silu_and_mul

    torch.manual_seed(0)
    layer = nn.Linear(8, 4)
    layer.__class__ = SkinnyLinear
    gate_up = torch.randn(3, 16)
    assert torch.equal(layer.forward_glu(gate_up), layer(silu_and_mul(gate_up)))
    for bad, call in ((torch.randn(2, 6), layer), (torch.randn(2, 8), layer.forward_glu)):
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            call(bad)  # the shape error F.linear gives


@pytest.mark.parametrize("family", ["qwen3", "gemma2", "llama-bias"])
def test_decoder_projections_are_skinny_linears(family):
    with torch.device("meta"):
        model = CausalLM(hf_config(family, tie=False), attn_backend=None)  # type: ignore[arg-type]
    layers = model.arch.num_layers
    skinny = [n for n, m in model.named_modules() if isinstance(m, SkinnyLinear)]
    assert len(skinny) == 4 * layers
    assert {n.rsplit(".", 1)[-1] for n in skinny} == set(skinny_gemm.PROJECTIONS)
    assert type(model.lm_head) is nn.Linear  # the LM head streams at bandwidth already
    assert use_skinny_gemm(model) == 0  # already turned


def test_disable_switch(monkeypatch):
    monkeypatch.setenv("CADENCE_DISABLE_SKINNY_GEMM", "1")
    assert read_envs().disable_skinny_gemm
    monkeypatch.delenv("CADENCE_DISABLE_SKINNY_GEMM")
    assert not read_envs().disable_skinny_gemm
    monkeypatch.setattr(skinny_gemm, "ENABLED", False)
    with torch.device("meta"):
        model = CausalLM(hf_config("qwen3", tie=False), attn_backend=None)  # type: ignore[arg-type]
    assert not any(isinstance(m, SkinnyLinear) for m in model.modules())


def test_glu_rows_and_switch(monkeypatch):
    """``forward_glu`` fuses SwiGLU up to ``GLU_MAX_ROWS`` rows (0 with the switch set) and
    otherwise runs SwiGLU then the plain forward; the same numbers on the CPU either way."""
    import subprocess

    probe = "from cadence.model import skinny_gemm; print(skinny_gemm.GLU_MAX_ROWS)"
    for value, rows in (("1", "0"), ("0", "4")):  # read once, at import
        env = {**os.environ, "CADENCE_DISABLE_SKINNY_GLU": value}
        got = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                             text=True, check=True, cwd=Path(__file__).parents[2]).stdout
        assert got.strip() == rows
    torch.manual_seed(0)
    model = CausalLM(hf_config("qwen3", tie=False), attn_backend=None)  # type: ignore[arg-type]
    mlp = model.model.layers[0].mlp
    assert isinstance(mlp.down_proj, SkinnyLinear)
    seen = []
    real = SkinnyLinear._run
    def run(self, x, glu):
        if self is mlp.down_proj:
            seen.append(glu)
        return real(self, x, glu)

    monkeypatch.setattr(SkinnyLinear, "_run", run)
    for limit in (4, 0):
        monkeypatch.setattr(skinny_gemm, "GLU_MAX_ROWS", limit)
        for rows in (1, 4, 5):
            x = torch.randn(rows, mlp.gate_up_proj.in_features)
            with torch.no_grad():
                gate, up = mlp.gate_up_proj(x).chunk(2, -1)
                want = F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
                seen.clear()
                torch.testing.assert_close(mlp(x), want)
            assert seen == [rows <= limit]


# --- GPU ----------------------------------------------------------------------------------------


def _table_or_heuristic(rows: int, n: int, k: int) -> SkinnyConfig:
    cfg = skinny_gemm.SKINNY_CONFIGS.get((n, k, row_bucket(rows)))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return cfg or heuristic_config(row_bucket(rows), n, k, sms)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", SMALL_CONFIGS, ids=str)
@pytest.mark.parametrize("m,n,k", SMALL_SHAPES + [(8, 1000, 1000), (2, 4100, 1030)])
def test_kernel_paths_on_gpu(cfg, m, n, k):
    check_kernel("cuda", torch.bfloat16, m, n, k, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", SMALL_CONFIGS, ids=str)
def test_kernel_paths_in_float16(cfg):
    check_kernel("cuda", torch.float16, 5, 17, 300, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2, 8, 16])
@pytest.mark.parametrize("name,n,k", REAL_SHAPES, ids=[s[0] for s in REAL_SHAPES])
def test_real_shapes_against_torch_bf16(name, n, k, rows):
    x, w, _ = _operands(rows, n, k, torch.bfloat16, "cuda", seed=rows, bias=False)
    expected = _reference(x, w, None)
    torch_bf16 = F.linear(x, w).double()
    cfgs = {_table_or_heuristic(rows, n, k), heuristic_config(row_bucket(rows), n, k, 132)}
    if rows <= 4:
        cfgs.add(SkinnyConfig(block_n=16, block_k=512, split_k=4, num_warps=8, num_stages=1,
                              dot=False))
    for cfg in cfgs:
        out = skinny_matmul(x, w, None, cfg).double()
        torch.testing.assert_close(out, expected, **_tol(torch.bfloat16), msg=str(cfg))
        # No further from the exact result than torch's own bf16 GEMM, give or take a rounding.
        ours, theirs = (out - expected).abs().max(), (torch_bf16 - expected).abs().max()
        assert ours <= theirs + 2 ** -8 * expected.abs().max(), (cfg, ours, theirs)
    out = skinny_linear(x, w)
    torch.testing.assert_close(out.double(), expected, **_tol(torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("split", [1, 4])
@pytest.mark.parametrize("name,n,k", [REAL_SHAPES[0], REAL_SHAPES[3], REAL_SHAPES[6]],
                         ids=[REAL_SHAPES[i][0] for i in (0, 3, 6)])
def test_inside_a_cuda_graph(name, n, k, rows, split):
    dot = rows > 1
    cfg = SkinnyConfig(block_n=64 if dot else 16, block_k=128 if dot else 512, split_k=split,
                       num_warps=4 if dot else 8, num_stages=3 if dot else 1, dot=dot)
    x, w, b = _operands(rows, n, k, torch.bfloat16, "cuda", seed=1)
    static_x = x.clone()
    skinny_matmul(static_x, w, b, cfg)  # compiles, allocates the counters: outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = skinny_matmul(static_x, w, b, cfg)
    for seed in (2, 3, 4):
        fresh, _, _ = _operands(rows, n, k, torch.bfloat16, "cuda", seed=seed, bias=False)
        static_x.copy_(fresh)
        graph.replay()
        eager = skinny_matmul(fresh, w, b, cfg)
        torch.cuda.synchronize()
        assert torch.equal(static_out, eager)
        torch.testing.assert_close(static_out.double(), _reference(fresh, w, b),
                                   **_tol(torch.bfloat16))
    assert int(skinny_gemm_kernels._SCRATCH[0][0].count_nonzero()) == 0


@pytest.mark.gpu
def test_dispatch_falls_back_where_the_kernel_does_not_apply(monkeypatch):
    x, w, b = _operands(4, 256, 512, torch.bfloat16, "cuda")
    calls = []
    real = skinny_gemm.skinny_matmul
    monkeypatch.setattr(skinny_gemm, "skinny_matmul", lambda *a: calls.append(a) or real(*a))
    skinny_linear(x, w, b)
    assert len(calls) == 1  # the kernel's case
    big, _, _ = _operands(17, 256, 512, torch.bfloat16, "cuda")
    cases = [(x.float(), w.float(), b.float()), (big, w, b), (x.t().contiguous().t(), w, b),
             (x, w.t().contiguous().t(), b), (x, w, torch.stack([b, b], 1)[:, 0])]  # fmt: skip
    for args in cases:
        assert torch.equal(skinny_linear(*args), F.linear(*args))
    monkeypatch.setattr(skinny_gemm, "ENABLED", False)
    assert torch.equal(skinny_linear(x, w, b), F.linear(x, w, b))
    assert len(calls) == 1


@pytest.mark.gpu
def test_decoder_steps_take_the_kernel_and_agree_with_cublas(monkeypatch):
    from cadence.model.attention import TorchAttentionBackend
    from tests.model.helpers import Chunk, cuda_args, make_batch, new_kv_caches

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
    calls = []
    real, real_norm = skinny_gemm.skinny_matmul, skinny_gemm.skinny_matmul_norm
    monkeypatch.setattr(skinny_gemm, "skinny_matmul", lambda *a: calls.append(a) or real(*a))
    # qkv and gate_up with their input's norm in the loads (4 rows)
    monkeypatch.setattr(skinny_gemm, "skinny_matmul_norm",
                        lambda *a: calls.append(a) or real_norm(*a))
    with torch.no_grad():
        model(*cuda_args(prefill))  # 15 tokens: the kernel's too
        saved = [c.clone() for c in caches]
        calls.clear()
        ours = model(*cuda_args(step)).float()
        assert len(calls) == 4 * model.num_layers
        for cache, before in zip(caches, saved, strict=True):
            cache.copy_(before)
        monkeypatch.setattr(skinny_gemm, "ENABLED", False)
        theirs = model(*cuda_args(step)).float()
    assert len(calls) == 4 * model.num_layers
    torch.testing.assert_close(ours, theirs, atol=0.1, rtol=0.05)


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [True, False])
def test_planned_launches_repeat_the_first_call_bit_for_bit(monkeypatch, bias):
    """After its first call per row count a SkinnyLinear launches its resolved plan (no
    dispatch): the same bits as skinny_matmul, eagerly and inside a CUDA graph, for aligned
    and misaligned inputs; a non-contiguous input keeps the checked path."""
    torch.manual_seed(0)
    n, k = 1024, 3072  # a table shape, split over K at one row
    layer = nn.Linear(k, n, bias=bias).cuda().to(torch.bfloat16)
    layer.__class__ = SkinnyLinear
    calls = []
    real = skinny_gemm.skinny_matmul
    monkeypatch.setattr(skinny_gemm, "skinny_matmul", lambda *a: calls.append(a) or real(*a))
    buf = torch.randn(16 * k + 1, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        for rows in (1, 3, 16):
            for x in (buf[: rows * k].view(rows, k), buf[1 : rows * k + 1].view(rows, k)):
                want = real(x, layer.weight, layer.bias, _table_or_heuristic(rows, n, k))
                first = layer(x)
                before = len(calls)
                again = [layer(x) for _ in range(3)]
                assert len(calls) == before  # the plan, not the dispatch
                for got in [first, *again]:
                    assert torch.equal(got, want)
                static_x = x.clone()
                layer(static_x)  # plan the clone's alignment before capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_out = layer(static_x)
                for _ in range(2):
                    graph.replay()
                torch.cuda.synchronize()
                assert torch.equal(static_out, want)
        wide = torch.randn(2, 2 * k, device="cuda").to(torch.bfloat16)[:, :k]  # not contiguous
        assert torch.equal(layer(wide), F.linear(wide, layer.weight, layer.bias))
    layer.float()  # new parameters: the plans are dropped
    assert "_skinny_plans" not in layer.__dict__


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", SMALL_CONFIGS, ids=str)
def test_glu_on_gpu(cfg):
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for m, n, k in SMALL_SHAPES:
            check_glu("cuda", dtype, m, n, k, cfg)


@pytest.mark.gpu
def test_down_projection_with_swiglu_inside_is_the_two_calls(monkeypatch):
    """SkinnyLinear.forward_glu == forward(silu_and_mul(gate_up)) bit for bit: first call,
    planned calls and a CUDA graph; past 16 rows it is the two calls."""
    from cadence.model.fused_ops import silu_and_mul

    torch.manual_seed(0)
    n, k = 1024, 3072  # Qwen3-0.6B's down projection (a table shape)
    layer = nn.Linear(k, n, bias=False).cuda().to(torch.bfloat16)
    layer.__class__ = SkinnyLinear
    with torch.no_grad():
        for rows in (1, 5, 16, 17):
            gate_up = torch.randn(rows, 2 * k, device="cuda").to(torch.bfloat16)
            want = layer(silu_and_mul(gate_up))
            for _ in range(3):
                assert torch.equal(layer.forward_glu(gate_up), want)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = layer.forward_glu(gate_up)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want)


@pytest.mark.gpu
def test_plans_follow_replaced_parameters_and_unplannable_inputs(monkeypatch):
    """A weight or bias replaced (not copied into) after planning gets plans of its own; a one-
    row input whose row stride specializes otherwise than K runs the kernel on every call."""
    torch.manual_seed(0)
    n, k = 256, 1024
    cfg = _table_or_heuristic(1, n, k)
    real = skinny_gemm.skinny_matmul
    calls = []
    monkeypatch.setattr(skinny_gemm, "skinny_matmul", lambda *a: calls.append(a) or real(*a))
    layer = nn.Linear(k, n, bias=True).cuda().to(torch.bfloat16)
    layer.__class__ = SkinnyLinear
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(layer(x), real(x, layer.weight, layer.bias, cfg))
        layer.bias = None
        assert torch.equal(layer(x), real(x, layer.weight, None, cfg))
        layer.weight = nn.Parameter(torch.randn(n, k, device="cuda").to(torch.bfloat16))
        for _ in range(2):
            assert torch.equal(layer(x), real(x, layer.weight, None, cfg))
        assert len(calls) == 3  # one dispatch per new parameter set, then its plan

        # A one-row input whose row stride (1048) specializes otherwise than its width: the
        # plan launches with the width as the stride (one row never reads it) when that
        # specialization is compiled, else the kernel keeps the checked path; never cuBLAS.
        n, k = 136, 1040
        cfg = _table_or_heuristic(1, n, k)
        fresh = nn.Linear(k, n, bias=False).cuda().to(torch.bfloat16)
        fresh.__class__ = SkinnyLinear
        row = torch.randn(2, k + 8, device="cuda").to(torch.bfloat16)[:1, :k]
        assert row.is_contiguous() and row.stride(0) % 16
        want = real(row, fresh.weight, None, cfg)
        calls.clear()
        for _ in range(3):
            assert torch.equal(fresh(row), want)
        (plan,) = fresh.__dict__["_skinny_plans"].values()
        assert plan is not None  # not cuBLAS
        assert len(calls) == (3 if plan is skinny_gemm._DISPATCH else 1)


if __name__ == "__main__":
    patch_interpreter()
    run_interpreter_cases()
    print(DONE)
