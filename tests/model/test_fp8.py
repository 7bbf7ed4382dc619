"""FP8: e4m3 weights with per-channel scales (``--quantization fp8``) and the FP8 KV cache.

On the CPU the arithmetic is emulated: it must be the quantized arithmetic exactly (checked
against a float64 computation of the definition), and close to the unquantized model. On the GPU
the kernels are checked against the same definitions, and whole models against bf16: per-step
logits cosine >= 0.99 over 256 teacher-forced decode steps, top-1 agreement >= 90%, and every
disagreement a near tie (each top-1 among the other's top two; the random model's next-token
distribution is flat: 91.8% top-1 agreement with FP8 weights on the H200).
"""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from cadence.engine.core import EngineCore
from cadence.model.attention import TorchAttentionBackend
from cadence.model.fp8 import Fp8Linear, quantize_rows
from cadence.model.loader import build_model
from cadence.model.registry import resolve_model
from tests.model.helpers import (
    VOCAB,
    Chunk,
    make_batch,
    make_hf_model,
    new_kv_caches,
    run_ours,
    save_hf_model,
)
from tests.tiny import tiny_args

FP8 = torch.float8_e4m3fn


def _reference_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, in float64: scale = amax / 448 per row, values rounded to e4m3."""
    x = x.double()
    scale = x.abs().amax(dim=1).clamp(min=1e-12) / 448.0
    return (x / scale[:, None]).float().to(FP8).double(), scale


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)


def test_quantize_rows_hits_the_range_and_rounds_to_e4m3() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 300, generator=gen) * torch.logspace(-3, 3, 7)[:, None]
    x[3] = 0.0
    q, scale = quantize_rows(x)
    assert q.dtype == FP8 and scale.dtype == torch.float32 and scale.shape == (7,)
    back = q.double() * scale.double()[:, None]
    nonzero = [i for i in range(7) if i != 3]
    # Each row's largest magnitude maps to 448; every value is within e4m3's half-ulp (2^-4).
    assert torch.equal(q[nonzero].float().abs().amax(1), torch.full((6,), 448.0))
    err = (back - x.double()).abs()
    assert bool((err <= x.double().abs() * 2**-4 + scale.double()[:, None] * 2**-9).all())
    assert bool((q[3].float() == 0).all()) and float(scale[3]) > 0


def test_emulated_linear_is_the_quantized_arithmetic() -> None:
    gen = torch.Generator().manual_seed(1)
    linear = nn.Linear(96, 40, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 96, generator=gen))
        linear.bias.copy_(torch.randn(40, generator=gen))
    x = torch.randn(2, 5, 96, generator=gen)
    fp8 = Fp8Linear.from_linear(linear)
    assert fp8.weight.dtype == FP8 and fp8.weight_scale.shape == (40,)
    xq, xs = _reference_quantize(x.reshape(-1, 96))
    wq, ws = _reference_quantize(linear.weight.detach())
    want = (xq @ wq.T) * xs[:, None] * ws[None, :] + linear.bias.double()
    got = fp8(x)
    assert got.shape == (2, 5, 40) and got.dtype == torch.float32
    torch.testing.assert_close(got.reshape(-1, 40).double(), want, rtol=1e-5, atol=1e-5)
    # Close to the unquantized layer (e4m3 keeps ~2 significant digits).
    assert float(_cosine(got.reshape(-1, 40), linear(x).reshape(-1, 40)).min()) > 0.999


def unit_gain_model(family: str, seed: int = 0):
    """A random HF model whose layers keep the activations' scale, as trained ones do: each
    matrix N(0, 1 / fan_in), norms 1 (Gemma's (1 + w): 0), biases 0.1 N(0, 1). (The helpers'
    models amplify every error on purpose, which makes any quantization look far off.)"""
    model = make_hf_model(family, tie=False, seed=seed)
    model.config.max_position_embeddings = 512  # room for a prompt and 256 decode steps
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(0.0 if family.startswith("gemma") else 1.0)
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = 1 if "embed" in name else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in**0.5)
    return model


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma2", "phi3", "qwen3-moe"])
def checkpoint(request, tmp_path_factory):
    return request.param, save_hf_model(unit_gain_model(request.param),
                                        tmp_path_factory.mktemp(request.param))


def _load(path, quantization: str | None = None, device: str = "cpu",
          dtype: torch.dtype = torch.float32):
    spec = resolve_model(str(path))
    return build_model(spec, dtype, device, "auto", TorchAttentionBackend(), 0,
                       quantization=quantization)


def test_moving_or_casting_keeps_the_e4m3_weight() -> None:
    """.to() and friends move the layer's tensors but keep the stored formats: e4m3 weight,
    float32 scales, the bias in the output dtype; the output is unchanged."""
    gen = torch.Generator().manual_seed(2)
    linear = nn.Linear(64, 32, bias=True)
    x = torch.randn(3, 64, generator=gen)
    fp8 = Fp8Linear.from_linear(linear)
    want = fp8(x)
    for move in (lambda m: m.to(torch.float16), lambda m: m.double(), lambda m: m.to("cpu"),
                 lambda m: m._apply(lambda t: t.clone())):
        moved = move(fp8)
        assert moved.weight.dtype == FP8 and moved.weight_scale.dtype == torch.float32
        assert moved.bias.dtype == torch.float32
        assert torch.equal(moved(x), want)


def test_every_decoder_projection_turns_fp8_and_nothing_else(checkpoint) -> None:
    _, path = checkpoint
    plain = {n for n, m in _load(path).named_modules() if isinstance(m, nn.Linear)}
    model = _load(path, "fp8")
    names = {n for n, m in model.named_modules() if isinstance(m, Fp8Linear)}
    # The layers' projections (MoE layers' experts are not modules; their routers stay).
    assert names == {n for n in plain if n.startswith("model.layers.") and n.endswith("proj")}
    assert names and all(".mlp.gate" != n[-9:] for n in names)
    from cadence.model.moe import Experts

    for experts in (m for m in model.modules() if isinstance(m, Experts)):
        assert experts.gate_up_proj.dtype == experts.down_proj.dtype == FP8
        assert experts.gate_up_scale.shape == experts.gate_up_proj.shape[:2]
        assert experts.down_scale.shape == experts.down_proj.shape[:2]
    assert model.lm_head is None or not isinstance(model.lm_head, Fp8Linear)
    assert all(p.dtype in (torch.float32, FP8) for p in model.parameters())


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(n)] for n in (5, 11, 17)]


def _prefill_logits(model, kv_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    model.bind_kv_caches([c.to(kv_dtype) for c in new_kv_caches(model)])
    prompts = _prompts(3)
    tables = [list(range(1 + 8 * i, 9 + 8 * i)) for i in range(len(prompts))]
    return run_ours(model, make_batch([Chunk(p, 0, t) for p, t in zip(prompts, tables,
                                                                        strict=True)]))


def test_fp8_weights_and_fp8_kv_cache_stay_close_to_float(checkpoint) -> None:
    _, path = checkpoint
    base = _prefill_logits(_load(path))
    for quantization, kv_dtype in (("fp8", torch.float32), (None, FP8), ("fp8", FP8)):
        got = _prefill_logits(_load(path, quantization), kv_dtype)
        cos = _cosine(got, base)
        assert float(cos.min()) >= 0.99, (quantization, kv_dtype, float(cos.min()))
        assert not torch.equal(got, base)  # something was quantized


def test_checkpoint_kv_scales_reach_the_attention_layers(tmp_path) -> None:
    path = save_hf_model(make_hf_model("llama", tie=False), tmp_path)
    weights = load_file(path / "model.safetensors")
    weights["model.layers.0.self_attn.k_scale"] = torch.tensor(0.25)
    weights["model.layers.1.self_attn.v_proj.output_scale"] = torch.tensor([2.0])
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    model = _load(path)
    attn = [layer.self_attn for layer in model.model.layers]
    assert [(a.k_scale, a.v_scale) for a in attn] == [(0.25, 1.0), (1.0, 2.0)]
    weights["model.layers.1.self_attn.kv_scale"] = torch.tensor(4.0)  # older: one for both
    del weights["model.layers.1.self_attn.v_proj.output_scale"]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    assert (_load(path).model.layers[1].self_attn.k_scale,
            _load(path).model.layers[1].self_attn.v_scale) == (4.0, 4.0)
    weights["model.layers.1.self_attn.kv_scale"] = torch.tensor(float("inf"))
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"'model.layers.1.self_attn.kv_scale'.*finite"):
        _load(path)
    weights["model.layers.1.self_attn.kv_scale"] = torch.tensor(4.0)
    # With an FP8 cache the scales apply: the stored keys are k / 0.25 (4x the bf16 values).
    weights["model.layers.0.self_attn.k_scale"] = torch.tensor([0.5, 0.5])
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError,
                       match=r"'model.layers.0.self_attn.k_scale'.*is one number, got shape \[2\]"):
        _load(path)


def test_fp8_cache_stores_scaled_values() -> None:
    from cadence.model.attention import read_kv_cache, write_kv_cache

    gen = torch.Generator().manual_seed(2)
    cache = torch.zeros(2, 4, 4, 2, 8, dtype=FP8)
    k, v = torch.randn(3, 2, 8, generator=gen), torch.randn(3, 2, 8, generator=gen) * 1000
    write_kv_cache(k, v, cache, torch.tensor([5, -1, 9]), k_scale=0.5, v_scale=4.0)
    assert torch.equal(cache[0, 1, 1].float(), (k[0] / 0.5).to(FP8).float())
    assert torch.equal(cache[1, 2, 1].float(), (v[2] / 4.0).clamp(-448, 448).to(FP8).float())
    assert float(cache.float().abs().sum()) == float(cache[:, 1, 1].float().abs().sum()
                                                     + cache[:, 2, 1].float().abs().sum())
    keys = read_kv_cache(cache, 0, torch.tensor([1]), 0.5)
    assert torch.equal(keys[0, 1], (k[0] / 0.5).to(FP8).float() * 0.5)


def test_engine_runs_fp8_and_the_fp8_cache_holds_twice_the_blocks_of_bf16() -> None:
    cores = {kv: EngineCore(tiny_args(dtype="bfloat16", kv_cache_dtype=kv,
                                      quantization="fp8" if kv == "fp8" else None))
             for kv in ("auto", "fp8")}
    try:
        bytes_ = {kv: core.runner.kv_block_bytes() for kv, core in cores.items()}
        assert bytes_["auto"] == 2 * bytes_["fp8"]
        assert cores["fp8"].runner.kv_caches[0].dtype == FP8
        from cadence.core_types import EngineCoreRequest
        from cadence.sampling_params import SamplingParams

        core = cores["fp8"]
        core.add_request(EngineCoreRequest("a", list(range(10, 40)),
                                           SamplingParams(temperature=0.0, max_tokens=12,
                                                          ignore_eos=True)))
        tokens: list[int] = []
        while core.has_work():
            outs, _ = core.step_fn()
            tokens += [t for o in outs.outputs for t in o.new_token_ids]
        assert len(tokens) == 12 and all(0 <= t < core.runner.vocab_size for t in tokens)
    finally:
        for core in cores.values():
            core.shutdown()


# ---- GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 64), (5, 1000), (16, 4096), (33, 14336)])
def test_token_quantization_kernel_is_the_definition(shape: tuple[int, int]) -> None:
    from cadence.model.fp8_kernels import quantize_tokens

    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 3
    x[0] = 0.0
    q, s = quantize_tokens(x)
    want_q, want_s = quantize_rows(x)
    torch.testing.assert_close(s, want_s, rtol=1e-6, atol=0)
    # Division by the same float32 scale: identical bytes but for rare one-ulp rounding.
    diff = (q.view(torch.uint8) != want_q.view(torch.uint8)).float().mean()
    assert float(diff) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 4096, 1024), (3, 1000, 1000), (16, 6144, 4096),
                                           (7, 96, 64), (2, 4096, 14336)])
def test_weight_only_kernel_matches_float64(dtype: torch.dtype, m: int, n: int, k: int) -> None:
    from cadence.model.fp8_kernels import WeightOnlyConfig, weight_only_linear
    from cadence.model.skinny_gemm_kernels import arrival_counters

    gen = torch.Generator(device="cuda").manual_seed(m * n)
    w = torch.randn(n, k, device="cuda", generator=gen)
    x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    wq, ws = quantize_rows(w)
    want = (x.double() @ wq.double().T) * ws.double()
    configs = [None, WeightOnlyConfig(16, 128, 4, 2), WeightOnlyConfig(32, 128, 4, 2, 4)]
    if dtype != torch.float32:  # larger tiles of float32 activations exceed shared memory
        configs += [WeightOnlyConfig(32, 256, 4, 3, 4), WeightOnlyConfig(64, 512, 8, 3, 8)]
    configs += [WeightOnlyConfig(16, 512, 4, 3, 1, True), WeightOnlyConfig(32, 256, 4, 3, 4, True)]
    if dtype != torch.float32:  # f16 products (float32 ignores the flag)
        configs += [WeightOnlyConfig(64, 256, 4, 3, 1, f16=True),
                    WeightOnlyConfig(128, 128, 4, 3, 8, f16=True)]
    for cfg in configs:
        first = weight_only_linear(x, wq, ws, cfg)
        for _ in range(20):  # split-K sums in a fixed order: every launch gives the same bits
            assert torch.equal(weight_only_linear(x, wq, ws, cfg), first)
        assert first.dtype == dtype
        rel = float((first.double() - want).norm() / want.norm())
        assert rel < (1e-5 if dtype == torch.float32 else 8e-3), (cfg, rel)
    torch.cuda.synchronize()
    assert int(arrival_counters(x.device).abs().sum()) == 0


@pytest.mark.gpu
def test_f16_products_keep_large_and_small_activations() -> None:
    """The f16 tiles keep bf16 accuracy for activations past f16's range (65504: the program
    redoes its slice in bf16) and for small activations, some below f16's smallest normal."""
    from cadence.model.fp8_kernels import WeightOnlyConfig, weight_only_linear

    gen = torch.Generator(device="cuda").manual_seed(3)
    wq, ws = quantize_rows(torch.randn(256, 1024, device="cuda", generator=gen))
    x = torch.randn(2, 1024, device="cuda", generator=gen)
    x[0] *= 3e4  # |x| up to ~1e5: past f16's largest value (65504)
    x[1] *= 1e-3  # some below f16's smallest normal (6e-5)
    x = x.to(torch.bfloat16)
    want = (x.double() @ wq.double().T) * ws.double()
    got = weight_only_linear(x, wq, ws, WeightOnlyConfig(32, 256, 4, 3, 2, f16=True)).double()
    assert torch.isfinite(got).all()
    for row in range(2):
        rel = float((got[row] - want[row]).norm() / want[row].norm())
        assert rel < 8e-3, (row, rel)


@pytest.mark.gpu
def test_split_k_weight_only_kernel_replays_in_a_cuda_graph() -> None:
    from cadence.model.fp8_kernels import WeightOnlyConfig, weight_only_linear

    cfg = WeightOnlyConfig(32, 256, 4, 3, 4)
    wq, ws = quantize_rows(torch.randn(4096, 4096, device="cuda"))
    x = torch.zeros(1, 4096, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        weight_only_linear(x, wq, ws, cfg)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = weight_only_linear(x, wq, ws, cfg)
    for seed in range(5):
        x.copy_(torch.randn(1, 4096, generator=torch.Generator().manual_seed(seed)))
        graph.replay()
        torch.testing.assert_close(out, weight_only_linear(x, wq, ws, cfg), atol=0, rtol=0)


@pytest.mark.gpu
def test_fp8_linear_on_cuda_matches_the_emulation() -> None:
    gen = torch.Generator().manual_seed(4)
    linear = nn.Linear(1024, 2048, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(2048, 1024, generator=gen) * 0.05)
        linear.bias.copy_(torch.randn(2048, generator=gen))
    cpu = Fp8Linear.from_linear(linear.bfloat16())
    gpu = Fp8Linear.from_linear(linear.cuda())
    for rows in (1, 16, 17, 300):  # weight-only kernel, then torch._scaled_mm
        x = torch.randn(rows, 1024, generator=gen).bfloat16()
        got, want = gpu(x.cuda()).cpu().float(), cpu(x).float()
        assert float(_cosine(got, want).min()) > 0.999, rows


def _decode(model, prompt: list[int], steps: int, kv_dtype: torch.dtype,
            forced: list[int] | None = None, device: str = "cuda"
            ) -> tuple[torch.Tensor, list[int]]:
    """A prefill of ``prompt`` then ``steps`` decode steps (the decode path's kernels) on
    ``device``, fed ``forced`` tokens or, without them, each step's argmax: (the logits of
    every step, the tokens fed)."""
    blocks = -(-(len(prompt) + steps) // 4) + 1
    shape = model.kv_cache_shape(blocks, 4)
    model.bind_kv_caches([torch.zeros(shape, dtype=kv_dtype, device=device)
                          for _ in range(model.num_layers)])
    table = list(range(1, blocks))
    logits = [_last_logits(model, make_batch([Chunk(prompt, 0, table)]), device)]
    fed: list[int] = []
    with torch.no_grad():
        for i in range(steps):
            token = forced[i] if forced is not None else int(logits[-1].argmax())
            fed.append(token)
            batch = make_batch([Chunk([token], len(prompt) + i, table)])
            logits.append(_last_logits(model, batch, device))
    return torch.stack(logits).float(), fed


def _last_logits(model, batch, device: str) -> torch.Tensor:
    from tests.model.helpers import cuda_args

    on_gpu = device.startswith("cuda")
    args = cuda_args(batch) if on_gpu else (batch.input_ids, batch.positions, batch.metadata)
    with torch.no_grad():
        hidden = model(*args)
    return model.compute_logits(hidden[: batch.metadata.num_actual_tokens])[-1]


def _worst_rank(got: torch.Tensor, ref: torch.Tensor) -> int:
    """Over the steps, the lowest place (0 = first) either's top-1 takes in the other's
    logits."""
    ref_in_got = (got > got.gather(1, ref.argmax(-1)[:, None])).sum(-1)
    got_in_ref = (ref > ref.gather(1, got.argmax(-1)[:, None])).sum(-1)
    return int(torch.maximum(ref_in_got, got_in_ref).max())


@pytest.mark.gpu
def test_fp8_models_track_bf16_over_256_decode_steps(tmp_path) -> None:
    from cadence.model.triton_backend import TritonAttentionBackend

    path = save_hf_model(unit_gain_model("qwen3"), tmp_path)
    spec = resolve_model(str(path))

    def load(quantization):
        return build_model(spec, torch.bfloat16, "cuda", "auto", TritonAttentionBackend(), 0,
                           quantization=quantization)

    prompt = _prompts(5)[2]
    # bf16's greedy continuation: the tokens every variant is fed.
    ref, tokens = _decode(load(None), prompt, 256, torch.bfloat16)
    for quantization, kv_dtype in (("fp8", torch.bfloat16), (None, FP8), ("fp8", FP8)):
        got, _ = _decode(load(quantization), prompt, 256, kv_dtype, tokens)
        cos = _cosine(got, ref)
        top1, ref_top1 = got.argmax(-1), ref.argmax(-1)
        agree = float((top1 == ref_top1).float().mean())
        # Where the two disagree, each one's choice is among the other's top 8 (vLLM's check
        # for quantized models, check_logprobs_close with 8 logprobs): a near tie of a random
        # model's flat distribution, never a miss.
        worst = _worst_rank(got, ref)
        why = (quantization, kv_dtype, float(cos.min()), float(cos.mean()), agree, worst)
        assert float(cos.min()) >= 0.99 and agree >= 0.90, why
        assert worst < 8, why


@pytest.mark.gpu
def test_fp8_engine_graphs_equal_eager_and_the_cache_doubles(tmp_path) -> None:
    from cadence.engine.llm import LLM
    from cadence.sampling_params import SamplingParams

    path = save_hf_model(make_hf_model("llama", tie=False), tmp_path)
    prompts = [{"prompt_token_ids": p} for p in _prompts(6)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs, blocks = {}, {}
    for kv, eager in (("auto", False), ("fp8", False), ("fp8", True)):
        llm = LLM(str(path), dtype="bfloat16", quantization="fp8", kv_cache_dtype=kv,
                  enforce_eager=eager, max_model_len=256, max_num_seqs=8,
                  gpu_memory_utilization=0.3, max_num_batched_tokens=512)
        try:
            outs[kv, eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
            # The cache the memory would hold (the engine takes only what 8 requests need).
            # NOTE: profiling rebinds scratch caches: the engine is done with its own.
            blocks[kv, eager] = llm.engine_core.runner._profile_cuda_blocks()
        finally:
            llm.engine_core.shutdown()
    assert outs["fp8", False] == outs["fp8", True]
    assert 1.95 <= blocks["fp8", False] / blocks["auto", False] <= 2.05
