"""Each tensor-parallel rank loads its own slice of every weight from the checkpoint."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cadence.model.arch import DecoderArch
from cadence.model.attention import TorchAttentionBackend
from cadence.model.loader import build_model
from cadence.model.parallel import TPShard, check_tensor_parallel
from cadence.model.registry import resolve_model
from tests.engine.tp_helpers import build_checkpoint


def _params(path, rank: int, size: int) -> dict[str, torch.Tensor]:
    spec = resolve_model(str(path))
    model = build_model(spec, torch.float32, "cpu", "auto", TorchAttentionBackend(), 0, rank,
                        size)
    return dict(model.named_parameters())


def test_shards_of_two_ranks_make_the_whole_weights(tmp_path):
    # One KV head (replicated), a vocabulary of 255 (the last rank gets a padding row), biases.
    path = build_checkpoint(tmp_path / "m", "llama-bias", kv_heads=1, vocab=255, tie=False)
    whole = _params(path, 0, 1)
    ranks = [_params(path, r, 2) for r in range(2)]
    attn = "model.layers.1.self_attn"
    mlp = "model.layers.1.mlp"
    q, hd = 4 * 16, 16  # 4 heads of 16
    full_qkv = whole[f"{attn}.qkv_proj.weight"]
    for r, p in enumerate(ranks):
        qkv = p[f"{attn}.qkv_proj.weight"]
        assert qkv.shape == (q // 2 + 2 * hd, 64)
        assert torch.equal(qkv[: q // 2], full_qkv[r * q // 2 : (r + 1) * q // 2])
        assert torch.equal(qkv[q // 2 :], full_qkv[q:])  # the one KV head, on both ranks
        assert torch.equal(p[f"{attn}.o_proj.weight"],
                           whole[f"{attn}.o_proj.weight"][:, r * q // 2 : (r + 1) * q // 2])
        assert torch.equal(p[f"{mlp}.down_proj.weight"],
                           whole[f"{mlp}.down_proj.weight"][:, r * 64 : (r + 1) * 64])
        gate_up = p[f"{mlp}.gate_up_proj.weight"]
        full_gate_up = whole[f"{mlp}.gate_up_proj.weight"]
        assert torch.equal(gate_up[:64], full_gate_up[r * 64 : (r + 1) * 64])
        assert torch.equal(gate_up[64:], full_gate_up[128 + r * 64 : 128 + (r + 1) * 64])
    # Row-parallel biases are added once: rank 0 holds them, rank 1 zeros.
    for name in (f"{attn}.o_proj.bias", f"{mlp}.down_proj.bias"):
        assert torch.equal(ranks[0][name], whole[name])
        assert not ranks[1][name].any()
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert ranks[0][name].shape == ranks[1][name].shape == (128, 64)
        assert torch.equal(torch.cat([ranks[0][name], ranks[1][name][:127]]), whole[name])
        assert not ranks[1][name][127].any()
    for r, p in enumerate(ranks):
        assert torch.equal(p["model.norm.weight"], whole["model.norm.weight"])
        bias = p[f"{attn}.qkv_proj.bias"]
        assert torch.equal(bias[: q // 2], whole[f"{attn}.qkv_proj.bias"][r * q // 2 :][: q // 2])


def _arch(**fields) -> DecoderArch:
    base = DecoderArch("LlamaForCausalLM", vocab_size=256, hidden_size=64,
                       intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=16, rms_norm_eps=1e-6, qkv_bias=False, o_bias=False,
                       mlp_bias=False, qk_norm=False, tie_word_embeddings=False,
                       max_position_embeddings=512)
    return dataclasses.replace(base, **fields)


@pytest.mark.parametrize(
    ("fields", "size", "needle"),
    [
        ({}, 3, r"must divide the model's num_attention_heads \(4\)"),
        ({"num_heads": 6, "num_kv_heads": 3}, 2, r"num_key_value_heads \(3\)"),
        ({"intermediate_size": 102}, 4, r"intermediate_size \(102\)"),
        ({"moe_layers": (True, True), "num_experts": 4, "num_experts_per_tok": 2,
          "moe_intermediate_size": 30}, 4, r"moe_intermediate_size \(30\)"),
        ({"architecture": "FalconForCausalLM"}, 2, "not supported under tensor parallelism"),
    ],
)
def test_splits_that_cannot_work_are_one_line_errors(fields, size, needle):
    with pytest.raises(ValueError, match=needle) as info:
        check_tensor_parallel(_arch(**fields), size)
    assert "\n" not in str(info.value)


def test_kv_heads_are_split_or_replicated():
    assert [TPShard.of(_arch(), r, 2).kv_head_start for r in range(2)] == [0, 1]
    four = [TPShard.of(_arch(), r, 4) for r in range(4)]
    assert [s.kv_head_start for s in four] == [0, 0, 1, 1]
    assert {s.num_kv_heads for s in four} == {1}
    assert [s.vocab_start for s in four] == [0, 64, 128, 192]


def test_an_uneven_vocabulary_is_split_in_padded_equal_ranges():
    shards = [TPShard.of(_arch(vocab_size=250), r, 4) for r in range(4)]
    assert {s.vocab_per_rank for s in shards} == {63}  # ceil(250 / 4); the last rank pads 2
    assert [s.vocab_start for s in shards] == [0, 63, 126, 189]


@pytest.mark.parametrize("rank", [-1, 2])
def test_a_rank_outside_the_group_is_refused(rank):
    with pytest.raises(ValueError, match=f"rank {rank} outside a tensor-parallel group of 2"):
        TPShard.of(_arch(), rank, 2)


def test_vocab_parallel_embeddings_sum_to_the_whole_embedding(monkeypatch):
    """Each rank embeds its own ids and zeros for the others'; the all-reduce (a sum) of the
    ranks' outputs is the plain embedding, ids at every range edge included."""
    from cadence.model import parallel

    monkeypatch.setattr(parallel, "all_reduce", lambda x: x)  # one rank's share, unreduced
    arch = _arch(vocab_size=250)
    full = torch.randn(252, 8, generator=torch.Generator().manual_seed(0))
    full[250:] = 0.0  # the padded rows
    ids = torch.tensor([0, 62, 63, 125, 126, 188, 189, 249, 7])
    total = torch.zeros(len(ids), 8)
    for r in range(4):
        shard = TPShard.of(arch, r, 4)
        emb = parallel.VocabParallelEmbedding(shard, 8)
        with torch.no_grad():
            emb.weight.copy_(full[shard.vocab_start:shard.vocab_start + shard.vocab_per_rank])
        total += emb(ids)
    torch.testing.assert_close(total, torch.nn.functional.embedding(ids, full[:250]))


def test_gathered_logits_are_in_vocabulary_order(monkeypatch):
    """gather_vocab puts rank r's columns at [r * per_rank, ...) of every row and drops the
    padded tail (all_gather stacks the ranks' tensors along dimension 0)."""
    from cadence.model.parallel import gather_vocab

    arch = _arch(vocab_size=250)
    shards = [TPShard.of(arch, r, 4) for r in range(4)]
    n = 3
    logits = torch.randn(n, 250, generator=torch.Generator().manual_seed(1))
    padded = torch.cat([logits, torch.full((n, 2), 99.0)], dim=1)
    per_rank = [padded[:, s.vocab_start:s.vocab_start + s.vocab_per_rank] for s in shards]

    def all_gather(out: torch.Tensor, local: torch.Tensor) -> None:
        assert torch.equal(local, per_rank[0])
        out.copy_(torch.cat(per_rank, dim=0))

    monkeypatch.setattr(torch.distributed, "all_gather_single", all_gather, raising=False)
    monkeypatch.setattr(torch.distributed, "all_gather_into_tensor", all_gather)
    got = gather_vocab(per_rank[0].contiguous(), shards[0], 250)
    assert got.shape == (n, 250) and got.is_contiguous()
    assert torch.equal(got, logits)
