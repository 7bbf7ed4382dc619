"""The mixture-of-experts MLP: router and experts against transformers' Qwen3-MoE block, the
grouping of (token, expert) pairs, and the Triton grouped GEMMs against the torch path.

Without a GPU the Triton kernels run in Triton's interpreter in a subprocess
(``python tests/model/test_moe.py`` with ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":  # the interpreter driver: before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402
import torch  # noqa: E402

from cadence.model.moe import (  # noqa: E402
    fused_moe_reference,
    group_by_expert,
)
from cadence.model.moe_router import route  # noqa: E402
from tests.model.triton_interpreter import DONE, patch_interpreter, run_interpreted  # noqa: E402


def _experts(num_experts: int, hidden: int, inter: int, seed: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(num_experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    down = torch.randn(num_experts, hidden, inter, generator=gen) / inter**0.5
    return gate_up.to(dtype), down.to(dtype)


def _routed(tokens: int, hidden: int, num_experts: int, top_k: int, seed: int, skew: bool = False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    logits = torch.randn(tokens, num_experts, generator=gen)
    if skew:  # most tokens pick experts 0..top_k-1: one long run, several empty experts
        logits[:, :top_k] += 6.0
    weights, ids = route(logits, top_k, renormalize=True)
    return x, weights, ids


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_block_matches_transformers_qwen3_moe(norm_topk_prob):
    import transformers
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from cadence.model.arch import DecoderArch
    from cadence.model.moe import SparseMoE

    config = transformers.Qwen3MoeConfig(
        hidden_size=32, moe_intermediate_size=24, num_experts=6, num_experts_per_tok=3,
        norm_topk_prob=norm_topk_prob, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=16,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = Qwen3MoeSparseMoeBlock(config).float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.5)
    ours = SparseMoE(DecoderArch.from_hf_config(config))
    ours.load_state_dict(
        {
            "gate.weight": hf.gate.weight,
            "experts.gate_up_proj": hf.experts.gate_up_proj,
            "experts.down_proj": hf.experts.down_proj,
        }
    )
    x = torch.randn(1, 19, 32)
    with torch.no_grad():
        want = hf(x)
        got = ours(x[0])
    assert want.abs().max() > 0.1
    torch.testing.assert_close(got, want[0], atol=1e-6, rtol=1e-6)


def test_tiles_by_dtype_shape_and_pairs():
    from cadence.model.moe import _IEEE_TILE, DEFAULT_TILE, MOE_TILES, moe_tiles, pair_bucket

    assert [pair_bucket(p) for p in (1, 8, 9, 64, 65, 256, 257)] == [8, 8, 64, 64, 256, 256, 0]
    assert moe_tiles(8, 2048, 768, torch.float32, False) == (_IEEE_TILE, _IEEE_TILE)
    assert moe_tiles(8, 256, 96, torch.bfloat16, False) == (DEFAULT_TILE, DEFAULT_TILE)
    assert moe_tiles(4096, 2048, 768, torch.bfloat16, True) == (DEFAULT_TILE, DEFAULT_TILE)
    for (kernel, hidden, inter, fp8, bucket), tile in MOE_TILES.items():
        got = moe_tiles(bucket, hidden, inter, torch.bfloat16, fp8)
        assert got[0 if kernel == "gate_up" else 1] == tile


def test_decode_kernels_up_to_their_measured_buckets():
    """Decode steps take the two-launch kernels up to 64 pairs (128 with FP8 experts), in
    narrow tiles up to 32 pairs and wide ones past; larger steps take the grouped GEMMs."""
    from cadence.model.moe import decode_tile
    from cadence.model.moe_decode import DecodeTile

    narrow, wide = DecodeTile(8, 256, 4, 3), DecodeTile(32, 128, 8, 3)
    for fp8 in (False, True):
        tiles = [decode_tile(p, fp8) for p in (1, 8, 9, 32, 33, 64)]
        assert [t[0] for t in tiles] == [narrow] * 4 + [wide] * 2
        assert tiles[0] == tiles[1] and tiles[2] == tiles[3]  # one token; two to four
        assert all(t[1].block_n * t[1].block_k <= 1024 for t in tiles)  # [k, n, k] registers
    assert decode_tile(65, False) is None and decode_tile(65, True)[0] == wide
    assert decode_tile(128, True)[0] == wide and decode_tile(129, True) is None


@pytest.mark.parametrize("fp8", [False, True])
def test_fused_moe_dispatches_by_bucket_and_decode_flag(monkeypatch, fp8):
    """Steps up to a bucket take the decode kernels with its tile; larger ones, or
    decode=False, the grouped GEMMs; decode=True takes the decode kernels past every bucket."""
    from cadence.model import moe

    calls = []

    class Grouped(Exception):
        pass

    def grouped(*args, **kwargs):
        raise Grouped

    monkeypatch.setattr(moe, "fused_moe_decode", lambda *a: calls.append(a[-1]) or a[0])
    monkeypatch.setattr(moe, "group_by_expert", grouped)
    experts, hidden, inter, top_k = 4, 8, 6, 2
    gate_up = torch.zeros(experts, 2 * inter, hidden)
    down = torch.zeros(experts, hidden, inter)
    scales = (torch.ones(experts, 2 * inter), torch.ones(experts, hidden)) if fp8 else None
    largest = max(b for f, b in moe.DECODE_TILES if f == fp8)
    for tokens, decode, want in ((1, None, moe.decode_tile(2, fp8)),
                                 (largest // top_k, None, moe.decode_tile(largest, fp8)),
                                 (largest // top_k + 1, None, None),
                                 (1, False, None),
                                 (largest, True, (moe._WIDE, moe._WIDE_DOWN))):
        x = torch.zeros(tokens, hidden)
        ids = torch.zeros(tokens, top_k, dtype=torch.int64)
        weights = torch.ones(tokens, top_k)
        calls.clear()
        try:
            moe.fused_moe_triton(x, weights, ids, gate_up, down, scales, decode=decode)
        except Grouped:
            assert want is None, (tokens, decode)
        else:
            assert calls == [want], (tokens, decode)


def test_route_renormalizes_the_top_k():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    weights, ids = route(logits, 2, renormalize=True)
    assert ids.tolist() == [[3, 2]]
    probs = torch.softmax(logits, -1)[0]
    torch.testing.assert_close(weights[0], probs[[3, 2]] / probs[[3, 2]].sum())
    raw, _ = route(logits, 2, renormalize=False)
    torch.testing.assert_close(raw[0], probs[[3, 2]])


@pytest.mark.parametrize("renormalize", [True, False])
def test_route_weights_come_in_the_logits_dtype(renormalize: bool) -> None:
    """As transformers' MoE blocks: softmax and renormalization in float32, then the weights
    cast to the model's dtype before they scale the experts' outputs."""
    logits = torch.tensor([[0.1, 1.3, 2.7, 0.4, 3.1]], dtype=torch.bfloat16)
    weights, ids = route(logits, 2, renormalize)
    assert ids.tolist() == [[4, 2]]
    want = torch.softmax(logits.float(), dim=-1)[0, [4, 2]]
    if renormalize:
        want = want / want.sum()
    assert weights.dtype == torch.bfloat16
    assert torch.equal(weights[0], want.to(torch.bfloat16))


@pytest.mark.parametrize("skew", [False, True])
def test_group_by_expert_lays_out_every_pair_once(skew):
    _, _, ids = _routed(37, 8, 8, 3, seed=1, skew=skew)
    groups = group_by_expert(ids, 8, 16)
    num_pairs = ids.numel()
    blocks = groups.sorted_pairs.view(-1, 16)
    assert blocks.shape[0] == groups.block_expert.shape[0]
    seen = []
    for block, expert in zip(blocks.tolist(), groups.block_expert.tolist(), strict=True):
        real = [p for p in block if p < num_pairs]
        if expert < 0:
            assert not real
            continue
        assert all(ids.flatten()[p] == expert for p in real)
        seen += real
    assert sorted(seen) == list(range(num_pairs))
    # Experts in increasing order, each one's blocks contiguous.
    used = [e for e in groups.block_expert.tolist() if e >= 0]
    assert used == sorted(used)


def test_group_by_expert_keeps_pair_order_within_a_run():
    """Runs in expert order and, within a run, pairs in pair order (the one-launch grouping
    on CUDA must lay them out alike)."""
    ids = torch.tensor([[2, 0], [0, 2], [1, 0], [2, 1]])
    groups = group_by_expert(ids, 4, 4)
    placed = [p for p in groups.sorted_pairs.tolist() if p < ids.numel()]
    assert placed == [1, 2, 5, 4, 7, 0, 3, 6]
    assert groups.block_expert.tolist()[:3] == [0, 1, 2]


@pytest.mark.parametrize(("tokens", "experts", "top_k", "block_m"),
                         [(1, 128, 8, 16), (32, 128, 8, 16), (37, 8, 3, 16), (5, 60, 4, 64),
                          (300, 16, 2, 64)])
def test_the_layout_is_sized_for_the_worst_routing(tokens, experts, top_k, block_m):
    from cadence.model.moe import _max_blocks

    pairs = tokens * top_k
    blocks = _max_blocks(pairs, experts, block_m)
    # Worst cases: every pair on its own expert, or the pairs spread so that each expert's run
    # ends one past a block boundary; the layout must hold the padded runs of each.
    for spread in (min(pairs, experts), max(1, min(experts, pairs // (block_m + 1)))):
        ids = (torch.arange(pairs) % spread).view(tokens, top_k)
        groups = group_by_expert(ids, experts, block_m)
        counts = torch.bincount(ids.flatten(), minlength=experts)
        used = int(((counts + block_m - 1) // block_m).sum())
        assert groups.block_expert.shape[0] == blocks >= used
        assert int((groups.block_expert >= 0).sum()) == used
        assert sorted(p for p in groups.sorted_pairs.tolist() if p < pairs) == list(range(pairs))
    assert blocks <= pairs // block_m + min(pairs, experts) + 1


def _fp8_experts(gate_up: torch.Tensor, down: torch.Tensor):
    """The experts in e4m3 with row scales, and their dequantized float32 values."""
    from cadence.model.fp8 import quantize_rows

    out = []
    for w in (gate_up, down):
        q, scale = quantize_rows(w.reshape(-1, w.shape[-1]))
        out.append((q.view(w.shape), scale.view(w.shape[:2])))
    (gq, gs), (dq, ds) = out
    return gq, dq, (gs, ds), gq.float() * gs[..., None], dq.float() * ds[..., None]


def run_triton_case(tokens: int, hidden: int, inter: int, num_experts: int, top_k: int,
                    skew: bool, seed: int, fp8: bool = False) -> None:
    """Both Triton paths (the grouped GEMMs and the decode kernels) against the reference."""
    from cadence.model.moe import fused_moe_triton

    x, weights, ids = _routed(tokens, hidden, num_experts, top_k, seed, skew)
    gate_up, down = _experts(num_experts, hidden, inter, seed)
    want = fused_moe_reference(x, weights, ids, gate_up, down)
    assert want.abs().max() > 0.1
    if fp8:  # e4m3 experts against the float32 experts they stand for
        gq, dq, scales, gate_up, down = _fp8_experts(gate_up, down)
        want = fused_moe_reference(x, weights, ids, gate_up, down)
        assert torch.allclose(fused_moe_reference(x, weights, ids, gq, dq, scales), want,
                              atol=1e-5)
        args = (x, weights, ids, gq, dq, scales)
    else:
        args = (x, weights, ids, gate_up, down)
    for decode in (False, True):
        got = fused_moe_triton(*args, decode=decode)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def run_routing_case(tokens: int, num_experts: int, top_k: int, block_m: int, seed: int,
                     device: str = "cpu") -> None:
    """The one-launch router and grouping (decode batches) against the torch operations."""
    from cadence.model.moe import _group_by_expert_triton
    from cadence.model.moe_router import route_triton

    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, num_experts, generator=gen)
    for renormalize in (True, False):
        want_w, want_ids = route(logits, top_k, renormalize)  # torch, on the CPU
        got_w, got_ids = route_triton(logits.to(device), top_k, renormalize)
        assert torch.equal(got_ids.cpu(), want_ids)
        torch.testing.assert_close(got_w.cpu(), want_w, atol=1e-6, rtol=1e-5)
    ids = torch.randint(0, num_experts, (tokens, top_k), generator=gen)
    ids[0] = 0  # one crowded expert
    want = group_by_expert(ids, num_experts, block_m)  # torch, on the CPU
    got = _group_by_expert_triton(ids.to(device).flatten(), num_experts, block_m)
    assert torch.equal(got.sorted_pairs.cpu(), want.sorted_pairs)
    assert torch.equal(got.block_expert.cpu(), want.block_expert)


def run_fused_router_case(tokens: int, hidden: int, num_experts: int, top_k: int, seed: int,
                          device: str = "cpu", dtype: torch.dtype = torch.float32,
                          rows: int | None = None) -> None:
    """The router's logits and routing in one launch against the linear layer and route():
    the same experts, the same weights; the counters are left at zero for the next call.
    ``rows``: logits per program (route_fused's choice by default)."""
    from cadence.model.moe_router import route_fused

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    gate = (torch.randn(num_experts, hidden, generator=gen) / hidden**0.5).to(dtype)
    x[0, 0] = float("nan") if tokens > 2 else x[0, 0]  # a graph's garbage padding row
    counter = torch.zeros(tokens + 3, dtype=torch.int32, device=device)
    for renormalize in (True, False):
        logits = (x.double() @ gate.double().T).to(dtype)
        want_w, want_ids = route(logits, top_k, renormalize)  # torch, on the CPU
        for _ in range(2):  # the second call reuses the counters
            got_w, got_ids = route_fused(x.to(device), gate.to(device), top_k, renormalize,
                                         counter, rows)
            assert torch.equal(counter.cpu(), torch.zeros_like(counter.cpu()))
            got_w, got_ids = got_w.cpu(), got_ids.cpu()
            real = slice(1, None) if tokens > 2 else slice(None)
            if dtype == torch.float32:
                assert torch.equal(got_ids[real], want_ids[real])
                torch.testing.assert_close(got_w[real], want_w[real], atol=1e-5, rtol=1e-5)
            else:
                # bf16 logits tie often and the kernel's sums round apart from the float64
                # ones by an ulp: every chosen expert must be among the top k up to 2^-6.
                ref = logits.float()[real]
                chosen = torch.gather(ref, 1, got_ids[real])
                kth = torch.topk(ref, top_k, dim=1).values[:, -1:]
                assert bool((chosen >= kth - 2**-6 * kth.abs().clamp(min=1)).all())
                probs = torch.softmax(ref, dim=1)
                w = torch.gather(probs, 1, got_ids[real])
                if renormalize:
                    w = w / w.sum(dim=1, keepdim=True)
                torch.testing.assert_close(got_w[real].float(), w, atol=2e-2, rtol=2e-2)
            assert bool(((got_ids >= 0) & (got_ids < num_experts)).all())
            assert all(len(set(row.tolist())) == top_k for row in got_ids)


def run_garbage_routing_case(device: str = "cpu") -> None:
    """A CUDA graph's padding rows may hold NaN (unwritten memory): the router still picks
    real experts for them and routes the other rows as torch does."""
    from cadence.model.moe_router import route_triton

    logits = torch.randn(4, 12, generator=torch.Generator().manual_seed(9))
    logits[1] = float("nan")
    logits[2, 3] = float("nan")
    got_w, got_ids = route_triton(logits.to(device), 4, True)
    got_ids = got_ids.cpu()
    assert bool(((got_ids >= 0) & (got_ids < 12)).all())
    assert bool(torch.isfinite(got_w).all())  # the all-NaN row's weights are 0, not 0 / 0
    for row in got_ids:
        assert len(set(row.tolist())) == 4  # four distinct experts
    want_w, want_ids = route(logits[[0, 3]], 4, True)
    assert torch.equal(got_ids[[0, 3]], want_ids)
    torch.testing.assert_close(got_w.cpu()[[0, 3]], want_w, atol=1e-6, rtol=1e-5)


def run_garbage_grouping_case(device: str = "cpu") -> None:
    """The one-launch grouping drops out-of-range ids: every other pair sits once in its
    expert's run, in order, and the layout is the torch grouping's of the valid pairs."""
    from cadence.model.moe import _group_by_expert_triton

    ids = torch.tensor([[3, 12], [-1, 0], [3, 2**40], [5, 0]])
    valid = (ids >= 0) & (ids < 12)
    got = _group_by_expert_triton(ids.to(device).flatten(), 12, 4)
    sorted_pairs, block_expert = got.sorted_pairs.cpu(), got.block_expert.cpu()
    flat = ids.flatten()
    placed = sorted_pairs[sorted_pairs < flat.numel()]
    assert sorted(placed.tolist()) == torch.nonzero(valid.flatten()).flatten().tolist()
    for pos, pair in enumerate(sorted_pairs.tolist()):
        if pair < flat.numel():
            assert block_expert[pos // 4] == flat[pair]
    # Runs in expert order, pairs in pair order within a run.
    assert placed.tolist() == sorted(placed.tolist(), key=lambda q: (int(flat[q]), q))


def run_decode_garbage_ids_case(device: str = "cpu") -> None:
    """An out-of-range expert id (garbage routing) reads a real expert, never out of bounds;
    the other tokens are untouched."""
    from cadence.model.moe_decode import fused_moe_decode

    x, weights, ids = _routed(3, 32, 6, 2, seed=4)
    gate_up, down = _experts(6, 32, 24, seed=4)
    want = fused_moe_reference(x, weights, ids, gate_up, down)
    bad = ids.clone()
    bad[1] = torch.tensor([-7, 99])
    got = fused_moe_decode(*(t.to(device) for t in (x, weights, bad, gate_up, down))).cpu()
    torch.testing.assert_close(got[[0, 2]], want[[0, 2]], atol=1e-4, rtol=1e-4)
    clamped = torch.tensor([[0, 5]])
    torch.testing.assert_close(
        got[1:2], fused_moe_reference(x[1:2], weights[1:2], clamped, gate_up, down),
        atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_garbage_rows_route_to_real_experts_on_gpu() -> None:
    run_decode_garbage_ids_case("cuda")
    run_garbage_routing_case("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "hidden", "experts", "top_k"),
                         [(1, 2048, 128, 8), (64, 2048, 128, 8), (7, 96, 60, 4), (3, 40, 8, 1)])
def test_fused_router_matches_linear_and_route_on_gpu(tokens, hidden, experts, top_k,
                                                      dtype) -> None:
    for seed in range(20):  # many launches: a lost count would leave a row unrouted
        run_fused_router_case(tokens, hidden, experts, top_k, seed, "cuda", dtype)
    run_fused_router_case(tokens, hidden, experts, top_k, 99, "cuda", dtype, rows=8)


@pytest.mark.gpu
def test_fused_router_replays_in_a_cuda_graph() -> None:
    """route_fused captured once and replayed with new activations routes each replay as the
    linear layer and route() do, and leaves its counters at zero."""
    from cadence.model.moe_router import route_fused

    gen = torch.Generator().manual_seed(11)
    tokens, hidden, experts, top_k = 4, 256, 60, 4
    gate = (torch.randn(experts, hidden, generator=gen) / hidden**0.5).cuda()
    x = torch.zeros(tokens, hidden, device="cuda")
    counter = torch.zeros(tokens, dtype=torch.int32, device="cuda")
    route_fused(x, gate, top_k, True, counter)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        weights, ids = route_fused(x, gate, top_k, True, counter)
    for _ in range(50):
        x.copy_(torch.randn(tokens, hidden, generator=gen))
        graph.replay()
        want_w, want_ids = route((x.double() @ gate.double().T).float().cpu(), top_k, True)
        assert torch.equal(ids.cpu(), want_ids)
        torch.testing.assert_close(weights.cpu(), want_w, atol=1e-5, rtol=1e-5)
    assert int(counter.abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize(("tokens", "experts", "top_k"), [(1, 128, 8), (32, 128, 8), (5, 60, 4),
                                                          (85, 8, 3), (3, 16, 1)])
def test_one_launch_routing_matches_torch_on_gpu(tokens, experts, top_k) -> None:
    for block_m in (16, 64):
        run_routing_case(tokens, experts, top_k, block_m, seed=tokens, device="cuda")


@pytest.mark.timeout(600)  # the interpreter's subprocess, minutes on 2 cores
def test_triton_moe_in_triton_interpreter() -> None:
    run_interpreted(__file__)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 7, 64, 1000])
def test_triton_moe_matches_reference_on_gpu(dtype, tokens) -> None:
    from cadence.model.moe import fused_moe_triton

    x, weights, ids = _routed(tokens, 256, 16, 4, seed=tokens)
    gate_up, down = _experts(16, 256, 96, seed=tokens)
    dev = "cuda"
    args = (x.to(dev, dtype), weights.to(dev, dtype), ids.to(dev), gate_up.to(dev, dtype),
            down.to(dev, dtype))  # fmt: skip
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    # FP8 experts: the kernels against the reference over the same e4m3 values and scales.
    gq, dq, (gs, ds), _, _ = _fp8_experts(gate_up, down)
    fp8 = (*args[:3], gq.to(dev), dq.to(dev), (gs.to(dev), ds.to(dev)))
    for case in (args, fp8):
        want = fused_moe_reference(*case).float().cpu()
        for decode in (False, True):
            got = fused_moe_triton(*case, decode=decode).float().cpu()
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8, 32])
def test_measured_tiles_match_reference_on_gpu(tokens) -> None:
    """Qwen3-30B-A3B's expert shape (hidden 2048, intermediate 768), where MOE_TILES applies."""
    from cadence.model.moe import fused_moe_triton

    x, weights, ids = _routed(tokens, 2048, 16, 8, seed=tokens)
    gate_up, down = _experts(16, 2048, 768, seed=tokens)
    dev, dtype = "cuda", torch.bfloat16
    args = (x.to(dev, dtype), weights.to(dev, dtype), ids.to(dev), gate_up.to(dev, dtype),
            down.to(dev, dtype))  # fmt: skip
    gq, dq, (gs, ds), _, _ = _fp8_experts(gate_up, down)
    fp8 = (*args[:3], gq.to(dev), dq.to(dev), (gs.to(dev), ds.to(dev)))
    for case in (args, fp8):
        want = fused_moe_reference(*case).float()
        for decode in (False, True):  # the measured tiles, and the decode kernels
            got = fused_moe_triton(*case, decode=decode).float()
            torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2)


if __name__ == "__main__":
    patch_interpreter()
    run_triton_case(5, 32, 24, 8, 3, False, 0)  # decode-sized: most experts empty
    run_triton_case(40, 48, 40, 6, 2, False, 1)  # odd feature sizes (masked tiles)
    run_triton_case(64, 32, 32, 8, 4, True, 2)  # one crowded expert over several blocks
    run_triton_case(5, 32, 24, 8, 3, False, 0, fp8=True)  # FP8 experts, row scales
    run_triton_case(40, 48, 40, 6, 2, True, 1, fp8=True)
    run_decode_garbage_ids_case()
    run_garbage_grouping_case()
    run_routing_case(1, 128, 8, 16, 3)
    run_routing_case(32, 128, 8, 16, 4)  # 256 pairs: the largest one-launch grouping
    run_routing_case(7, 10, 3, 4, 5)
    run_garbage_routing_case()
    run_fused_router_case(1, 64, 32, 4, 6)
    run_fused_router_case(5, 40, 12, 3, 7)  # rows and experts off the block sizes
    run_fused_router_case(3, 40, 12, 3, 8, rows=8)  # a partial last block of experts
    print(DONE)
