"""Our CausalLM, loaded from an HF checkpoint, gives transformers' logits over the paged cache."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from cadence.model.attention import TorchAttentionBackend
from cadence.model.decoder import CausalLM
from cadence.model.loader import build_model
from cadence.model.registry import resolve_model
from tests.model.helpers import (
    VOCAB,
    Chunk,
    cuda_args,
    hf_config,
    hf_logits,
    load_ours,
    make_batch,
    make_hf_model,
    new_kv_caches,
    run_ours,
    save_hf_model,
)

ATOL = 1e-4
LENGTHS = (5, 11, 17)


@pytest.fixture(
    scope="module",
    params=[
        ("llama", False),
        ("llama-bias", True),
        ("qwen2", True),
        ("qwen3", False),
        ("qwen3", True),
        ("mistral", False),
        ("phi3", False),
        ("gemma2", True),
        ("gemma3", True),
        ("qwen3-moe", False),
    ],
    ids=lambda p: f"{p[0]}-{'tied' if p[1] else 'untied'}",
)
def models(request, tmp_path_factory):
    family, tie = request.param
    hf = make_hf_model(family, tie)
    path = save_hf_model(hf, tmp_path_factory.mktemp(family))
    return hf, path


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(n)] for n in LENGTHS]


def _block_tables(seed: int, num_seqs: int, blocks_each: int) -> list[list[int]]:
    """Disjoint, shuffled (so non-contiguous) block tables; block 0 stays the dummy block."""
    pool = list(range(1, 1 + num_seqs * blocks_each))
    random.Random(seed).shuffle(pool)
    return [pool[i * blocks_each : (i + 1) * blocks_each] for i in range(num_seqs)]


def _assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ref.abs().max() > 1.0  # the logits carry signal: a wrong model cannot pass by accident
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)


def test_batched_prefill_matches_transformers(models):
    hf, path = models
    model = load_ours(path)
    prompts = _prompts(0)
    tables = _block_tables(0, len(prompts), 6)
    batch = make_batch([Chunk(p, 0, t) for p, t in zip(prompts, tables, strict=True)])
    logits = run_ours(model, batch)
    expected = torch.cat([hf_logits(hf, p) for p in prompts])
    _assert_close(logits, expected)


def test_chunked_prefill_attends_to_cached_first_chunk(models):
    hf, path = models
    model = load_ours(path)
    prompts = _prompts(1)
    tables = _block_tables(1, len(prompts), 6)
    splits = [2, 6, 9]  # the second chunks start mid-block
    first = make_batch(
        [Chunk(p[:s], 0, t) for p, s, t in zip(prompts, splits, tables, strict=True)]
    )
    run_ours(model, first)
    second = make_batch(
        [Chunk(p[s:], s, t) for p, s, t in zip(prompts, splits, tables, strict=True)]
    )
    logits = run_ours(model, second)
    expected = torch.cat([hf_logits(hf, p)[s:] for p, s in zip(prompts, splits, strict=True)])
    _assert_close(logits, expected)


def test_decode_step_over_paged_cache_with_padding(models):
    hf, path = models
    model = load_ours(path)
    prompts = _prompts(2)
    tables = _block_tables(2, len(prompts), 6)
    run_ours(model, make_batch([Chunk(p, 0, t) for p, t in zip(prompts, tables, strict=True)]))
    next_tokens = [7, 8, 9]
    chunks = [
        Chunk([tok], len(p), t) for p, tok, t in zip(prompts, next_tokens, tables, strict=True)
    ]
    for step in range(2):  # two decode steps, the second one padded like a CUDA-graph bucket
        batch = make_batch(chunks, num_padding_tokens=3 * step)
        assert batch.metadata.is_decode_only
        logits = run_ours(model, batch)
        expected = torch.stack(
            [
                hf_logits(hf, p + [tok] * (step + 1))[-1]
                for p, tok in zip(prompts, next_tokens, strict=True)
            ]
        )
        _assert_close(logits, expected)
        chunks = [Chunk(c.tokens, c.start + 1, c.block_table) for c in chunks]


def test_meta_construction_and_shapes():
    config = hf_config("qwen3", tie=False)
    with torch.device("meta"):
        model = CausalLM(config, TorchAttentionBackend())
    assert model.num_layers == 2 and model.num_kv_heads == 2 and model.head_dim == 32
    assert model.kv_cache_shape(10, 16) == (2, 10, 16, 2, 32)
    assert model.kv_cache_bytes_per_block(16, torch.bfloat16) == 2 * 16 * 2 * 32 * 2 * 2
    qkv = model.model.layers[0].self_attn.qkv_proj.weight
    assert tuple(qkv.shape) == (4 * 32 + 2 * 2 * 32, 64) and qkv.is_meta
    assert tuple(model.model.layers[0].mlp.gate_up_proj.weight.shape) == (2 * 96, 64)


def test_forward_needs_bound_caches_of_the_right_shape(models):
    _, path = models
    model = load_ours(path)
    with pytest.raises(ValueError, match="expected 2 KV caches"):
        model.bind_kv_caches([torch.zeros(model.kv_cache_shape(4, 4))])
    bad = [torch.zeros(2, 4, 4, model.num_kv_heads + 1, model.head_dim)] * model.num_layers
    with pytest.raises(ValueError, match="KV cache 0 has shape"):
        model.bind_kv_caches(bad)
    unbound = CausalLM(hf_config("llama", tie=False), TorchAttentionBackend())
    batch = make_batch([Chunk([1, 2], 0, [1])])
    with pytest.raises(RuntimeError, match="bind_kv_caches"):
        unbound(batch.input_ids, batch.positions, batch.metadata)


class _GraphSafeDecodeAttention:
    """Decode-only paged attention without host syncs (masks come from ``seq_lens`` on the
    device), so a forward through it can be captured; stands in for the GPU backends here."""

    name = "graph-safe-decode"

    def forward(self, q, k, v, kv_cache, metadata, scale, sliding_window=0, softcap=0.0,
                k_scale=1.0, v_scale=1.0, rope=None, qkv_releases_early=False):
        assert sliding_window == 0 and softcap == 0.0 and kv_cache.dtype != torch.float8_e4m3fn
        if rope is not None:  # the q/k norms and RoPE a backend applies (AttentionBackend)
            q, k = rope.apply(q, k)
        num_kv_heads, head_dim = kv_cache.shape[-2:]
        kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, metadata.slot_mapping, k)
        kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, metadata.slot_mapping, v)
        tables = metadata.block_tables.long()
        keys = kv_cache[0][tables].flatten(1, 2).repeat_interleave(q.shape[1] // num_kv_heads, 2)
        values = kv_cache[1][tables].flatten(1, 2).repeat_interleave(q.shape[1] // num_kv_heads, 2)
        key_pos = torch.arange(keys.shape[1], device=q.device)
        valid = key_pos[None, :] < metadata.seq_lens[:, None]  # [B, K]; unwritten slots may be NaN
        scores = torch.einsum("bhd,bkhd->bhk", q.float(), keys.float().nan_to_num()) * scale
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        probs = torch.nan_to_num(scores.softmax(-1))  # padded rows (seq_len 0) give zeros
        values = values.float().masked_fill(~valid[:, :, None, None], 0.0)
        return torch.einsum("bhk,bkhd->bhd", probs, values.float()).to(q.dtype)


@pytest.mark.gpu
def test_cuda_bf16_and_graph_captured_decode(tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False
    hf = make_hf_model("qwen3", tie=False)
    save_hf_model(hf, tmp_path)
    prompts = _prompts(4)
    tables = _block_tables(4, len(prompts), 6)
    expected = torch.cat([hf_logits(hf, p) for p in prompts])
    decode_ref = torch.stack([hf_logits(hf, p + [5])[-1] for p in prompts])
    spec = resolve_model(str(tmp_path))
    batch = make_batch([Chunk(p, 0, t) for p, t in zip(prompts, tables, strict=True)])
    for dtype, atol in ((torch.float32, 1e-3), (torch.bfloat16, 0.25)):
        model = build_model(spec, dtype, "cuda", "auto", TorchAttentionBackend(), 0)
        model.bind_kv_caches([c.cuda() for c in new_kv_caches(model, dtype)])
        with torch.no_grad():
            hidden = model(*cuda_args(batch))
            logits = model.compute_logits(hidden).cpu()
        torch.testing.assert_close(logits, expected, atol=atol, rtol=0)

    # The bf16 model's decode step, captured in a CUDA graph and replayed, gives the eager
    # step's logits (the attention is swapped for a capturable one).
    backend = _GraphSafeDecodeAttention()
    for layer in model.model.layers:
        layer.self_attn.backend = backend
    step = make_batch([Chunk([5], len(p), t) for p, t in zip(prompts, tables, strict=True)], 1)
    ids, pos, md = cuda_args(step)
    caches = [c.clone() for c in model._kv_caches]
    with torch.no_grad():
        eager = model.compute_logits(model(ids, pos, md))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model(ids, pos, md)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = model.compute_logits(model(ids, pos, md))
        for cache, saved in zip(model._kv_caches, caches, strict=True):
            cache.copy_(saved)
        graph.replay()
        torch.cuda.synchronize()
    torch.testing.assert_close(captured[:3], eager[:3], atol=1e-2, rtol=0)
    torch.testing.assert_close(captured[:3].cpu(), decode_ref, atol=0.25, rtol=0)


def test_the_capturable_stand_in_backend_matches_transformers_on_cpu(tmp_path):
    """The GPU test's stand-in attention, run eagerly on the CPU in float32 through the decode
    step it captures there: transformers' logits. Its signature and arithmetic are checked on
    every run, not only on a GPU (a backend argument it lacked broke the GPU test unseen)."""
    hf = make_hf_model("qwen3", tie=False)
    save_hf_model(hf, tmp_path)
    prompts = _prompts(4)
    tables = _block_tables(4, len(prompts), 6)
    decode_ref = torch.stack([hf_logits(hf, p + [5])[-1] for p in prompts])
    model = build_model(resolve_model(str(tmp_path)), torch.float32, "cpu", "auto",
                        TorchAttentionBackend(), 0)
    model.bind_kv_caches(new_kv_caches(model, torch.float32))
    with torch.no_grad():
        run_ours(model, make_batch([Chunk(p, 0, t) for p, t in zip(prompts, tables,
                                                                  strict=True)]))
        for layer in model.model.layers:
            layer.self_attn.backend = _GraphSafeDecodeAttention()
        step = make_batch([Chunk([5], len(p), t) for p, t in zip(prompts, tables, strict=True)],
                          1)
        logits = model.compute_logits(model(step.input_ids, step.positions, step.metadata))
    _assert_close(logits[: len(prompts)], decode_ref)


def test_kv_caches_without_the_key_value_dimension_are_refused():
    model = CausalLM(hf_config("qwen3", tie=False), TorchAttentionBackend())
    shape = list(model.kv_cache_shape(4, 4))
    for first in (1, 3):
        bad = [torch.zeros([first, *shape[1:]])] * model.num_layers
        with pytest.raises(ValueError, match="KV cache 0 has shape"):
            model.bind_kv_caches(bad)
    with pytest.raises(ValueError, match="KV cache 0 has shape"):
        model.bind_kv_caches([torch.zeros(shape[1:])] * model.num_layers)


@pytest.mark.parametrize("length", [31, 32, 33])
def test_longrope_model_matches_transformers_around_the_original_length(tmp_path, length):
    """Phi-3 with longrope at 31, 32 and 33 tokens (original length 32) against transformers.
    NOTE: this small random model's logits barely depend on which factors rotate q and k (the
    two choices differ by ~2e-6 at 32 tokens), so the choice itself is pinned by
    test_rope.py's test_longrope_rows_switch_past_the_original_length_per_sequence."""
    hf = make_hf_model("phi3-long", tie=False, seed=2)
    model = load_ours(save_hf_model(hf, tmp_path))
    tokens = [random.Random(length).randrange(VOCAB) for _ in range(length)]
    logits = run_ours(model, make_batch([Chunk(tokens, 0, list(range(1, 10)))]))
    _assert_close(logits, hf_logits(hf, tokens))


def test_logits_keep_the_models_dtype_unless_a_soft_cap_follows(models):
    """``as_float=False`` skips only the cast: the same values, in the model's dtype (float32
    where a final soft cap has to run in it)."""
    _, path = models
    model = load_ours(path, torch.bfloat16)
    hidden = torch.randn(3, model.arch.hidden_size, generator=torch.Generator().manual_seed(0))
    hidden = hidden.to(torch.bfloat16)
    full = model.compute_logits(hidden)
    own = model.compute_logits(hidden, as_float=False)
    assert full.dtype == torch.float32
    assert own.dtype == (torch.float32 if model.arch.final_softcap else torch.bfloat16)
    assert torch.equal(own.float(), full)


def test_gemma3_ignores_an_attention_soft_cap_in_its_config(tmp_path):
    """transformers' Gemma 3 attention passes no soft cap whatever the config holds (Gemma 2's
    does): a Gemma 3 checkpoint whose config carries attn_logit_softcapping gives the same
    logits as transformers', uncapped."""
    hf = make_hf_model("gemma3", True)
    hf.config.attn_logit_softcapping = 5.0
    path = save_hf_model(hf, tmp_path / "gemma3-cap")
    model = load_ours(path)
    prompt = _prompts(3)[2]
    batch = make_batch([Chunk(prompt, 0, _block_tables(3, 1, 6)[0])])
    _assert_close(run_ours(model, batch), hf_logits(hf, prompt))


def test_gemma_scales_embeddings_by_the_normalizer_rounded_to_the_dtype(tmp_path):
    """transformers multiplies Gemma's embeddings by sqrt(hidden_size) rounded to the model's
    dtype (in bf16 sqrt(72) = 8.485 becomes 8.5): the first layer's input equals
    transformers' bit for bit."""
    config = hf_config("gemma2", True)
    config.hidden_size = 72
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = save_hf_model(hf, tmp_path / "gemma2-72")
    hf = hf.to(torch.bfloat16)
    model = load_ours(path, torch.bfloat16)
    seen: dict[str, torch.Tensor] = {}

    def theirs(_module, args, kwargs) -> None:
        seen["hf"] = (args[0] if args else kwargs["hidden_states"])[0]

    def ours(_module, args) -> None:
        seen["ours"] = args[0]

    hf.model.layers[0].register_forward_pre_hook(theirs, with_kwargs=True)
    model.model.layers[0].register_forward_pre_hook(ours)
    prompt = _prompts(4)[1]
    hf(torch.tensor([prompt]))
    run_ours(model, make_batch([Chunk(prompt, 0, _block_tables(4, 1, 6)[0])]))
    assert seen["ours"].dtype == torch.bfloat16
    assert torch.equal(seen["ours"], seen["hf"])
