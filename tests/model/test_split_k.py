"""K-split projections (model/split_k.py): the table's choice, the partial sums against a float64
reference, the norm kernel that adds them up, and the decoder's use of both."""

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

from cadence.model import decoder, fused_ops, split_k  # noqa: E402
from cadence.model.split_k import (  # noqa: E402
    MIN_ROWS,
    KParts,
    split_k_linear,
    split_k_parts,
    table_parts,
    weight_parts,
)
from tests.model.helpers import Chunk, hf_config, make_batch, new_kv_caches  # noqa: E402
from tests.model.triton_interpreter import DONE, patch_interpreter, run_interpreted  # noqa: E402

O_PROJ, DOWN_PROJ = (1024, 2048), (1024, 3072)  # Qwen3-0.6B's o and down projections, [N, K]


def _parts_reference(parts: torch.Tensor, dtype: torch.dtype, residual: torch.Tensor,
                     weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The projection's output (the float64 sum of the parts, rounded once), then transformers'
    residual add and RMSNorm in float64 with its roundings to ``dtype``."""
    x = parts.double().sum(0).to(dtype)
    s = (residual.double() + x.double()).to(dtype)
    s64 = s.double()
    normed = (s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    return (normed.double() * weight.double()).to(dtype), s


def check_parts_norm(device: str, dtype: torch.dtype, parts: int, rows: int, width: int) -> None:
    gen = torch.Generator(device).manual_seed(parts * 1000 + rows + width)
    p = torch.randn(parts, rows, width, generator=gen, device=device)
    residual = torch.randn(rows, width, generator=gen, device=device).to(dtype)
    weight = (1 + 0.2 * torch.randn(width, generator=gen, device=device)).to(dtype)
    from cadence.model.rms_norm_kernels import launch_parts_rms_norm

    out, new_residual = launch_parts_rms_norm(p, dtype, residual, weight, 1e-6)
    want_out, want_residual = _parts_reference(p, dtype, residual, weight, 1e-6)
    assert out.dtype == dtype and new_residual.dtype == dtype
    # The sum of the parts in float32 may round the projection's output one step away from the
    # float64 sum's rounding; everything after it is one rounding each.
    tol = {torch.float32: dict(atol=1e-5, rtol=1e-5),
           torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
           torch.float16: dict(atol=4e-3, rtol=4e-3)}[dtype]  # fmt: skip
    torch.testing.assert_close(new_residual.double(), want_residual.double(), **tol)
    torch.testing.assert_close(out.double(), want_out.double(), **tol)
    # Every row written, none past them: a second launch on other rows changes nothing here.
    again, _ = launch_parts_rms_norm(p, dtype, residual, weight, 1e-6)
    assert torch.equal(again, out)
    # The RMSNorm kernel given the projection output the parts add up to (in part order): the
    # same new residual; the norm may differ in its sum of squares' order only.
    from cadence.model.rms_norm_kernels import launch_rms_norm

    x = p[0].clone()
    for part in p[1:]:
        x += part
    if device == "cpu" and dtype == torch.bfloat16:
        return  # the interpreter's float32 -> bfloat16 is not torch's rounding (x.to(dtype))
    want_out, want_res = launch_rms_norm(x.to(dtype), residual, weight, 1e-6)
    assert torch.equal(new_residual, want_res)
    ulp = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(out, want_out, atol=ulp, rtol=ulp)


def run_interpreter_cases() -> None:
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for parts, rows, width in ((1, 3, 64), (2, 5, 100), (8, 2, 1024), (3, 4, 96),
                                   (2, 2, 1500)):
            check_parts_norm("cpu", dtype, parts, rows, width)


# --- CPU ----------------------------------------------------------------------------------------


@pytest.mark.timeout(600)  # the interpreter's subprocess
def test_kernel_in_triton_interpreter() -> None:
    run_interpreted(__file__)


def test_the_table_by_row_range() -> None:
    for n, k in (O_PROJ, DOWN_PROJ):
        assert [table_parts(n, k, rows) for rows in
                (1, MIN_ROWS - 1, MIN_ROWS, 64, 65, 128, 129, 256, 257, 4096)] == \
            [0, 0, 8, 8, 4, 4, 2, 2, 0, 0]
    assert table_parts(4096, 1024, 64) == 0  # a shape the table does not list


def test_a_decode_step_splits_as_its_graph_does() -> None:
    # An eager step of r rows and the graph it would replay (r padded to a capture size) take
    # the same kernels, so graphs == eager holds wherever the skinny kernel's row buckets did.
    from cadence.graphs.sizes import capture_sizes, padded_batch_size
    from cadence.model.skinny_gemm_kernels import row_bucket

    for max_num_seqs in (6, 8, 64, 256, 512):
        sizes = capture_sizes(max_num_seqs)
        for (n, k) in split_k.SPLIT_K_TABLE:
            for rows in range(1, max_num_seqs + 1):
                padded = padded_batch_size(rows, sizes)
                eager, graph = table_parts(n, k, rows) > 0, table_parts(n, k, padded) > 0
                if eager != graph:  # then neither may be the skinny kernel's
                    raise AssertionError((max_num_seqs, n, k, rows, padded))
                if not eager and rows <= 16:
                    assert row_bucket(rows) == row_bucket(padded), (rows, padded)


def test_the_table_is_ordered_and_divides_k() -> None:
    for (n, k), ranges in split_k.SPLIT_K_TABLE.items():
        most = [m for m, _ in ranges]
        assert most == sorted(most) and most[0] >= MIN_ROWS, (n, k)
        for _, parts in ranges:
            assert parts >= 2 and k % parts == 0 and (k // parts) % 8 == 0, (n, k, parts)


def test_nothing_splits_off_the_gpu() -> None:
    w = torch.randn(*O_PROJ, dtype=torch.bfloat16)
    x = torch.randn(64, O_PROJ[1], dtype=torch.bfloat16)
    assert split_k_parts(x, w) == 0 and weight_parts(w, 64, torch.bfloat16) == 0


def test_partial_sums_add_up_to_the_product() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, 96, generator=gen)
    w = torch.randn(40, 96, generator=gen) / 96**0.5
    # Rows of a wider buffer (not contiguous) and a contiguous input alike.
    wide = torch.zeros(9, 100)
    wide[:, :96] = x
    for inp in (x, wide[:, :96]):
        for parts in (2, 3, 4, 8):
            out = split_k_linear(inp, w, parts)
            assert isinstance(out, KParts) and out.parts.shape == (parts, 9, 40)
            assert out.parts.dtype == torch.float32 and out.shape == (9, 40)
            slices = [x[:, i * 96 // parts:(i + 1) * 96 // parts].double()
                      @ w[:, i * 96 // parts:(i + 1) * 96 // parts].double().T
                      for i in range(parts)]
            tol = dict(atol=1e-5, rtol=1e-5)  # float32 products
            torch.testing.assert_close(out.parts.double(), torch.stack(slices), **tol)
            torch.testing.assert_close(out.total().double(), x.double() @ w.double().T, **tol)


def test_the_norms_take_partial_sums() -> None:
    gen = torch.Generator().manual_seed(1)
    parts = torch.randn(4, 6, 32, generator=gen)
    residual = torch.randn(6, 32, generator=gen)
    weight = 1 + 0.2 * torch.randn(32, generator=gen)
    kp = KParts(parts, torch.float32)
    got = fused_ops.add_rms_norm(kp, residual, weight, 1e-6)
    want = fused_ops.add_rms_norm(parts.sum(0), residual, weight, 1e-6)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    # Without a residual (never the decoder's case, but defined): the sum, normed.
    out, s = fused_ops.norm_and_project(lambda h: h * 2, kp, None, weight, 1e-6)
    torch.testing.assert_close(s, parts.sum(0))
    torch.testing.assert_close(out, 2 * fused_ops.rms_norm(parts.sum(0), weight, 1e-6))


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_the_decoder_with_split_projections_is_the_decoder(monkeypatch, family: str) -> None:
    # Forced on the CPU (float32 partial sums of the same slices): every o and down projection
    # returns partials, each layer's norms and the final one add them up; the logits are the
    # unsplit model's to float32 rounding.
    from cadence.model.attention import TorchAttentionBackend

    torch.manual_seed(0)
    model = decoder.CausalLM(hf_config(family, tie=False), TorchAttentionBackend())
    model.bind_kv_caches(new_kv_caches(model))
    prompts = [[3, 4, 5, 6, 7, 8, 9, 10, 11], [9, 10, 12, 13, 14, 15, 16, 17]]
    batch = make_batch([Chunk(p, 0, [1 + 3 * i, 2 + 3 * i, 3 + 3 * i])
                        for i, p in enumerate(prompts)])
    with torch.no_grad():
        plain = model(batch.input_ids, batch.positions, batch.metadata)
        model.bind_kv_caches(new_kv_caches(model))
        calls = []
        real = split_k_linear

        def counted(x, w, parts):
            calls.append((x.shape[0], tuple(w.shape), parts))
            return real(x, w, parts)

        monkeypatch.setattr(decoder, "weight_parts", lambda w, rows, dtype: 4)
        monkeypatch.setattr(decoder, "split_k_linear", counted)
        split = model(batch.input_ids, batch.positions, batch.metadata)
    assert len(calls) == 2 * model.num_layers  # o and down in every layer
    torch.testing.assert_close(split, plain, atol=1e-5, rtol=1e-5)


def test_the_bulk_gemm_table_takes_what_it_lists_from_the_split(monkeypatch) -> None:
    """Where the bulk GEMM's table lists a projection (mode "plain") at a row count, o and down
    stay whole products for it (the split is not taken); the others still split. And each
    decode step tells the backend whether its qkv projection is the bulk GEMM ("norm" listed)."""
    from cadence.model import attention_layer
    from cadence.model.attention import TorchAttentionBackend

    torch.manual_seed(0)
    model = decoder.CausalLM(hf_config("qwen3", tie=False), TorchAttentionBackend())
    model.bind_kv_caches(new_kv_caches(model))
    o_shape = tuple(model.model.layers[0].self_attn.o_proj.weight.shape)
    qkv_shape = tuple(model.model.layers[0].self_attn.qkv_proj.weight.shape)
    listed = {(o_shape, "plain", 2), (qkv_shape, "norm", 2)}  # o, qkv; not down
    asked = []

    def mma_listed(w, mode, rows):
        asked.append((tuple(w.shape), mode, rows))
        return (tuple(w.shape), mode, rows) in listed

    calls = []
    hints = []
    real_split, real_forward = split_k_linear, TorchAttentionBackend.forward

    def counted(x, w, parts):
        calls.append(tuple(w.shape))
        return real_split(x, w, parts)

    def forward(self, *args, qkv_releases_early=False, **kwargs):
        hints.append(qkv_releases_early)
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(decoder, "weight_parts", lambda w, rows, dtype: 4)
    monkeypatch.setattr(decoder, "split_k_linear", counted)
    monkeypatch.setattr(decoder, "mma_listed", mma_listed)
    monkeypatch.setattr(attention_layer, "mma_listed", mma_listed)
    monkeypatch.setattr(TorchAttentionBackend, "forward", forward)
    prompts = [[3, 4], [9, 10, 12]]
    with torch.no_grad():
        for i, p in enumerate(prompts):  # the first: a 2-token pass, the row count listed
            prefill = make_batch([Chunk(p, 0, [1 + 3 * i, 2 + 3 * i])])
            model(prefill.input_ids, prefill.positions, prefill.metadata)
        assert hints == [False] * 2 * model.num_layers  # a prefill pass is no decode step
        calls.clear()
        hints.clear()
        decode = make_batch([Chunk([7], len(p), [1 + 3 * i, 2 + 3 * i])
                             for i, p in enumerate(prompts)])
        model(decode.input_ids, decode.positions, decode.metadata)
    down_shape = tuple(model.model.layers[0].mlp.down_proj.weight.shape)
    assert calls == [down_shape] * model.num_layers  # o is the bulk GEMM's, down splits
    assert hints == [True] * model.num_layers
    # The qkv answer is looked up once per layer and row count, not at every step.
    asked.clear()
    with torch.no_grad():
        model(decode.input_ids, decode.positions, decode.metadata)
    assert (qkv_shape, "norm", 2) not in asked
    # q/k norms launched on their own (Gemma's) stand between the projection and attention.
    for layer in model.model.layers:
        layer.self_attn.fused_qk_norm = False
    hints.clear()
    with torch.no_grad():
        model(decode.input_ids, decode.positions, decode.metadata)
    assert hints == [False] * model.num_layers


def test_the_split_yields_to_the_bulk_gemm_in_any_mode_the_projection_may_take(
        monkeypatch) -> None:
    """down may run the bulk GEMM in "glu" mode (SwiGLU in its loads) or "plain": a listing in
    either takes it from the split; o runs "plain" only."""
    w = torch.zeros(8, 64)
    monkeypatch.setattr(decoder, "weight_parts", lambda weight, rows, dtype: 4)
    for listed, modes, want in (({"glu"}, ("plain", "glu"), 0), ({"plain"}, ("plain", "glu"), 0),
                                ({"glu"}, ("plain",), 4), (set(), ("plain", "glu"), 4)):
        monkeypatch.setattr(decoder, "mma_listed",
                            lambda weight, mode, rows, listed=listed: mode in listed)
        assert decoder._split_parts(w, 8, torch.bfloat16, modes) == want, (listed, modes)


def test_disable_switch(monkeypatch) -> None:
    import subprocess

    code = "from cadence.model import split_k; print(split_k.ENABLED)"
    env = dict(os.environ, CADENCE_DISABLE_SPLIT_K="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout.strip()
    assert out == "False"


# --- GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("parts", "rows", "width"), [(8, 64, 1024), (2, 200, 1024), (4, 3, 96),
                                                      (6, 17, 4096)])
def test_parts_norm_kernel_on_gpu(dtype, parts: int, rows: int, width: int) -> None:
    check_parts_norm("cuda", dtype, parts, rows, width)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [O_PROJ, DOWN_PROJ])
@pytest.mark.parametrize("rows", [8, 64, 100, 256])
def test_split_products_against_float64(n: int, k: int, rows: int) -> None:
    gen = torch.Generator("cuda").manual_seed(rows + n + k)
    x = torch.randn(rows, k, generator=gen, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen, device="cuda") / k**0.5).to(torch.bfloat16)
    parts = table_parts(n, k, rows)
    out = split_k_linear(x, w, parts)
    assert isinstance(out, KParts) and out.parts.shape == (parts, rows, n)
    want = x.double() @ w.double().T
    # float32 partial sums: far inside one bfloat16 rounding of the output.
    torch.testing.assert_close(out.parts.double().sum(0), want, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(out.total().double(), want, atol=1.6e-2, rtol=1e-2)
    torch.testing.assert_close(out.total(), F.linear(x, w), atol=1.6e-2, rtol=1e-2)


@pytest.mark.gpu
def test_the_h200_table_decides_on_the_gpu() -> None:
    w = torch.randn(*O_PROJ, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, O_PROJ[1], device="cuda", dtype=torch.bfloat16)
    on_table = torch.cuda.get_device_capability() == split_k.TABLE_CAPABILITY
    assert split_k_parts(x, w) == (8 if on_table and split_k.ENABLED else 0)
    assert split_k_parts(x.float(), w.float()) == 0  # float32 weights keep the whole product
    assert split_k_parts(x[:4], w) == 0  # under MIN_ROWS


@pytest.mark.gpu
def test_the_engine_splits_and_graphs_equal_eager(tmp_path, monkeypatch) -> None:
    # A random Qwen3 whose o and down shapes the table is made to list: decode steps of 5-256
    # rows (and mixed steps) take the split, and CUDA graphs give the eager tokens.
    import random

    import transformers

    from cadence.engine.llm import LLM
    from cadence.sampling_params import SamplingParams
    from tests.hf_models import hf_config as full_config

    config = full_config("qwen3", False, 10000.0, vocab_size=512, hidden_size=256,
                         intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                         eos_token_id=2)  # fmt: skip
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(
        tmp_path)
    q_size = 4 * config.head_dim
    monkeypatch.setattr(split_k, "SPLIT_K_TABLE", {(256, q_size): ((256, 4),),
                                                   (256, 512): ((64, 8), (256, 2))})
    monkeypatch.setattr(split_k, "device_capability", lambda device: split_k.TABLE_CAPABILITY)
    monkeypatch.setattr(split_k, "ENABLED", True)
    calls = []
    real = split_k_linear
    monkeypatch.setattr(decoder, "split_k_linear",
                        lambda x, w, parts: calls.append(parts) or real(x, w, parts))
    rng = random.Random(5)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 512) for _ in range(5 + 2 * i)]}
               for i in range(12)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = {}
    for eager in (False, True):
        calls.clear()
        llm = LLM(str(tmp_path), dtype="bfloat16", enforce_eager=eager, max_model_len=256,
                  max_num_seqs=16, gpu_memory_utilization=0.3, max_num_batched_tokens=512)
        try:
            outs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
            tapes = llm.engine_core.runner.tapes
            if eager and tapes is not None:  # eager decode steps replay their split products
                assert not tapes.refused and tapes.replays > 0, dict(tapes.refused)
        finally:
            llm.engine_core.shutdown()
        assert {2, 4, 8} <= set(calls), sorted(set(calls))
    assert outs[False] == outs[True]
    assert all(len(t) == 12 for t in outs[False])


if __name__ == "__main__":
    patch_interpreter()
    run_interpreter_cases()
    print(DONE)
