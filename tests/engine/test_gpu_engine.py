"""GPU end-to-end checks: graphs == eager, == transformers, async on == off (run with -m gpu)."""

from __future__ import annotations

import gc
import random

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def _llm(**kw):
    from cadence import LLM

    kw.setdefault("num_gpu_blocks_override", 1024)
    kw.setdefault("device", "cuda")
    return LLM(**kw)


def _free(llm) -> None:
    llm.engine_core.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()


def _prompts(n: int, vocab: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 40))]}
            for _ in range(n)]


@pytest.mark.parametrize("batch", [1, 3, 8, 33])
def test_graphs_equal_eager_float32(batch):
    from cadence import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    results = {}
    for eager in (True, False):
        llm = _llm(model="tiny", dtype="float32", enforce_eager=eager, max_num_seqs=64)
        if not eager:
            assert llm.engine_core.runner.graphs is not None
        outs = llm.generate(_prompts(batch, 600, seed=batch), params, use_tqdm=False)
        results[eager] = [o.outputs[0].token_ids for o in outs]
        _free(llm)
    assert results[True] == results[False]


def test_greedy_matches_transformers_on_gpu(tmp_path):
    from cadence import SamplingParams
    from tests.hf_models import VOCAB, build_hf_model, hf_greedy

    model = build_hf_model("qwen3", tmp_path)
    prompts = [p["prompt_token_ids"] for p in _prompts(6, VOCAB, seed=7)]
    expected = hf_greedy(model, prompts, 32)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    # Plain, then chunked prefill (mixed prefill/decode steps, rows that do not sample).
    for async_scheduling, chunk in ((False, None), (True, None), (True, 16), (False, 16)):
        llm = _llm(model=str(tmp_path), dtype="float32", skip_tokenizer_init=True,
                   max_model_len=256, max_num_seqs=8, async_scheduling=async_scheduling,
                   max_num_batched_tokens=chunk)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected
        _free(llm)


def test_async_on_equals_off_bf16_graphs_seeded_and_greedy():
    from cadence import SamplingParams

    prompts = _prompts(20, 600, seed=3)
    params = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True) if i % 2 else
              SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=40, ignore_eos=True)
              for i in range(len(prompts))]
    results = {}
    for async_scheduling in (False, True):
        llm = _llm(model="tiny", async_scheduling=async_scheduling, max_num_seqs=32)
        outs = llm.generate(prompts, params, use_tqdm=False)
        results[async_scheduling] = [o.outputs[0].token_ids for o in outs]
        _free(llm)
    assert results[False] == results[True]


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("config", ["chunked", "preempt", "partial"])
def test_mixed_step_graphs_equal_eager_float32(config, async_scheduling):
    """Mixed prefill/decode steps replaying token-bucket graphs == eager, token for token."""
    from cadence import SamplingParams
    from tests.engine.test_graph_buckets import CONFIGS, PROMPTS

    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    prompts = PROMPTS + _prompts(9, 600, seed=11)
    results = {}
    for eager in (True, False):
        llm = _llm(model="tiny", dtype="float32", enforce_eager=eager, max_num_seqs=6,
                   max_model_len=256, async_scheduling=async_scheduling,
                   **{**CONFIGS[config], "num_gpu_blocks_override":
                      CONFIGS[config].get("num_gpu_blocks_override", 1024)})
        outs = llm.generate(prompts, params, use_tqdm=False)
        runner = llm.engine_core.runner
        if not eager:
            assert runner.mixed_graphs is not None and runner.mixed_graphs.num_replays > 0
        results[eager] = [o.outputs[0].token_ids for o in outs]
        _free(llm)
    assert results[True] == results[False]


def test_bf16_greedy_agrees_with_transformers_within_bf16_rounding(tmp_path):
    """The bf16 engine (graphs, async scheduling, Triton kernels) against transformers.

    Greedy runs in bf16 may part ways with the float32 reference wherever two logits are closer
    than bf16 rounding, so the check is per step, teacher-forced on cadence's own sequence:
    cadence's token must be the float32 reference's argmax or within ``tol`` of it, where
    ``tol`` is twice the largest difference between transformers itself in bf16 and in float32
    on the same sequences (the rounding noise of this very computation). Small embeddings make
    the RMSNorm epsilon matter, as it does for real models' first layers."""
    from cadence import SamplingParams
    from tests.hf_models import VOCAB, build_hf_model

    model = build_hf_model("qwen3", tmp_path)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.05)
    model.save_pretrained(tmp_path)
    prompts = [p["prompt_token_ids"] for p in _prompts(8, VOCAB, seed=11)]
    llm = _llm(model=str(tmp_path), dtype="bfloat16", skip_tokenizer_init=True,
               max_model_len=256, max_num_seqs=8, async_scheduling=True)
    assert llm.engine_core.runner.graphs is not None
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    outs = [o.outputs[0].token_ids for o in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
    _free(llm)

    _check_within_bf16_rounding(model, tmp_path, prompts, outs)


def _check_within_bf16_rounding(model, tmp_path, prompts, outs, max_positions=512,
                                arch="qwen3") -> None:
    """Per step, teacher-forced on cadence's own sequences: cadence's token is the float32
    reference's argmax or within twice transformers' own bf16 noise of it (see below)."""
    from tests.hf_models import build_hf_model

    ref32 = model.float().cuda().eval()
    ref16 = build_hf_model(arch, tmp_path / "copy", max_positions=max_positions)  # same weights
    with torch.no_grad():
        ref16.model.embed_tokens.weight.mul_(0.05)
    ref16 = ref16.to(device="cuda", dtype=torch.bfloat16).eval()
    noise, gaps, agree = 0.0, [], 0
    with torch.no_grad():
        for prompt, gen in zip(prompts, outs):
            seq = torch.tensor([prompt + list(gen)], device="cuda")
            rows = slice(len(prompt) - 1, seq.shape[1] - 1)  # logits that chose gen[i]
            l32 = ref32(seq).logits[0, rows].float()
            l16 = ref16(seq).logits[0, rows].float()
            noise = max(noise, (l16 - l32).abs().max().item())
            chosen = torch.tensor(gen, device="cuda")
            gaps += (l32.max(dim=-1).values - l32.gather(1, chosen[:, None])[:, 0]).tolist()
            agree += int((l32.argmax(dim=-1) == chosen).sum())
    tol = 2 * noise
    assert 0 < noise < 0.5, noise  # bf16 noise of this model: small, but not zero
    assert max(gaps) <= tol, (max(gaps), tol)
    assert agree >= 0.9 * len(gaps), (agree, len(gaps))


def test_fresh_prompt_graphs_agree_with_transformers_within_bf16_rounding(tmp_path):
    """Lone prompts of 150-1024 tokens replay the graphs of a fresh prompt (dense attention
    over the pass's own keys: the Triton kernel at this model's heads); their greedy tokens
    pass the same bf16 check."""
    from cadence import SamplingParams
    from tests.hf_models import VOCAB, build_hf_model

    model = build_hf_model("qwen3", tmp_path, max_positions=2048)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.05)
    model.save_pretrained(tmp_path)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (150, 500, 900, 1024)]
    llm = _llm(model=str(tmp_path), dtype="bfloat16", skip_tokenizer_init=True,
               max_model_len=1100, max_num_seqs=4, async_scheduling=True)
    runner = llm.engine_core.runner
    assert runner.fresh_graphs is not None
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0]
            .outputs[0].token_ids for p in prompts]  # one at a time: each a lone prompt
    assert runner.fresh_graphs.num_replays == 4
    assert runner.fresh_graphs.sizes[0] == 128  # the Triton kernel's minimum
    dense = runner.model.attn_backend.dense_prefill
    # The kernels ran in the captures (each layer's call counts once per capture and warm-up):
    # the Triton kernel for the buckets of small causal work, cuDNN past them.
    heads = runner.model.arch.num_heads
    small = [s for s in runner.fresh_graphs.sizes if dense.prefers_triton(s, heads)]
    assert dense.triton and 128 in small and 1024 in small
    assert dense.triton_calls >= 2 * len(small)
    assert dense.calls - dense.triton_calls >= 2 * (len(runner.fresh_graphs.sizes) - len(small))
    _free(llm)
    _check_within_bf16_rounding(model, tmp_path, prompts, outs, max_positions=2048)


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_fresh_prompt_graphs_with_windows_and_caps(family, tmp_path):
    """A family with sliding windows (and Gemma 2's soft caps): lone prompts far past the window
    replay the fresh-prompt graphs, every layer through the Triton kernel with its window and
    cap, and pass the bf16 check against transformers."""
    from cadence import SamplingParams
    from tests.hf_models import MISTRAL_WINDOW, VOCAB, build_hf_model

    model = build_hf_model(family, tmp_path, max_positions=2048)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.05)
    model.save_pretrained(tmp_path)
    rng = random.Random(7)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (150, 700)]
    assert min(map(len, prompts)) > 4 * MISTRAL_WINDOW
    llm = _llm(model=str(tmp_path), dtype="bfloat16", skip_tokenizer_init=True,
               max_model_len=800, max_num_seqs=4)
    runner = llm.engine_core.runner
    assert runner.fresh_graphs is not None and runner.fresh_graphs.sizes[0] == 128
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    outs = [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0]
            .outputs[0].token_ids for p in prompts]
    assert runner.fresh_graphs.num_replays == 2
    dense = runner.model.attn_backend.dense_prefill
    assert dense.triton and dense.triton_calls > 0
    _free(llm)
    _check_within_bf16_rounding(model, tmp_path, prompts, outs, max_positions=2048, arch=family)


FAMILIES = ["mistral", "phi3", "phi3-long", "phi4-mini", "gemma2", "gemma3", "llama-yarn",
            "qwen3-moe"]


@pytest.mark.parametrize("family", FAMILIES)
def test_families_graphs_equal_eager_and_transformers(family, tmp_path):
    """Each added family on the GPU kernels (sliding windows, soft caps, longrope rows, partial
    rotation, fused MoE): CUDA graphs == eager == transformers' greedy tokens, in float32."""
    from cadence import SamplingParams
    from tests.hf_models import VOCAB, build_hf_model, hf_greedy

    model = build_hf_model(family, tmp_path)
    rng = random.Random(5)
    lengths = (40, 50, 33) if family in ("phi3-long", "phi4-mini") else (5, 17, 50, 40)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in lengths]
    expected = hf_greedy(model, prompts, 24)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for eager in (True, False):
        llm = _llm(model=str(tmp_path), dtype="float32", skip_tokenizer_init=True,
                   max_model_len=256, max_num_seqs=8, enforce_eager=eager)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected, f"eager={eager}"
        _free(llm)


def test_longrope_switch_on_the_gpu_equals_the_cpu_engine(tmp_path):
    """Prompts that decode past longrope's switch (recomputed there on the long factors), chunked
    by a 64-token budget: CUDA graphs == eager == the CPU engine, in float32. The CPU engine is
    the reference: it equals transformers where transformers recomputes its cache at the switch
    (tests/engine/test_llm_correctness.py, transformers 5.25); the GPU machine's transformers
    5.17 gives other tokens from a few steps past the switch on (its cache reset there is not
    the whole recomputation later releases make)."""
    from cadence import SamplingParams
    from tests.hf_models import VOCAB, build_hf_model

    build_hf_model("phi3-long", tmp_path)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (40, 20, 31, 10, 33)]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    common = dict(model=str(tmp_path), dtype="float32", skip_tokenizer_init=True,
                  max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64)
    got = {}
    for mode in ("cpu", "eager", "graphs"):
        llm = _llm(**common, enforce_eager=mode != "graphs",
                   device="cpu" if mode == "cpu" else "cuda")
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        got[mode] = [o.outputs[0].token_ids for o in outs]
        _free(llm)
    assert got["eager"] == got["cpu"] and got["graphs"] == got["cpu"]
