"""Mixture-of-experts MLP (Qwen3-MoE): a top-k softmax router and SwiGLU experts.

``fused_moe`` runs the experts either as a plain-torch loop over the experts that got tokens
(the CPU path and the reference, transformers' arithmetic) or, on CUDA, as two grouped Triton
GEMMs over (token, expert) pairs sorted by expert (``group_by_expert``). The Triton path reads
only shapes on the host: its grid is sized for the worst case of ``num_tokens * top_k`` pairs
spread over every expert, so it is CUDA-graph capturable. The router's softmax and top k are in
``moe_router`` (decode-sized batches on CUDA compute the logits and route them in one launch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cadence.model.arch import DecoderArch
from cadence.model.moe_decode import DecodeTile, fused_moe_decode
from cadence.model.moe_kernels import (
    _moe_align_kernel,
    _moe_down_kernel,
    _moe_gate_up_kernel,
)
from cadence.model.moe_router import ROUTER_MAX_TOKENS, route_hidden
from cadence.model.parallel import all_reduce
from cadence.runtime.triton_launch import TritonLaunch, next_pow2

try:
    import triton
except ImportError:  # pragma: no cover - CPU installs
    triton = None

if triton is not None:
    _GATE_UP = TritonLaunch(_moe_gate_up_kernel)
    _DOWN = TritonLaunch(_moe_down_kernel)
    _ALIGN = TritonLaunch(_moe_align_kernel)
# Up to this many (token, expert) pairs one program groups them (a pairs x pairs comparison);
# more take the torch operations.
ALIGN_MAX_PAIRS = 256


Scales = tuple[torch.Tensor, torch.Tensor] | None  # FP8 experts' row scales [E, 2I], [E, H]


def _expert_weight(w: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype
                   ) -> torch.Tensor:
    return w if scale is None else (w.float() * scale[:, None]).to(dtype)


def fused_moe_reference(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    scales: Scales = None,
) -> torch.Tensor:
    """``sum_j weights[t, j] * expert_{ids[t, j]}(x[t])``, one expert at a time (host loop);
    FP8 experts are dequantized one at a time."""
    out = torch.zeros_like(x)
    gs, ds = scales if scales is not None else (None, None)
    for expert in torch.unique(ids).tolist():
        token, slot = torch.where(ids == expert)
        w_gate_up = _expert_weight(gate_up[expert], None if gs is None else gs[expert], x.dtype)
        w_down = _expert_weight(down[expert], None if ds is None else ds[expert], x.dtype)
        gate, up = F.linear(x[token], w_gate_up).chunk(2, dim=-1)
        h = F.linear(F.silu(gate) * up, w_down) * weights[token, slot, None]
        out.index_add_(0, token, h.to(out.dtype))
    return out


@dataclass(frozen=True)
class ExpertGroups:
    """(token, expert) pairs sorted by expert, each expert's run padded to ``block_m``.

    ``sorted_pairs[i]`` is a pair index ``token * top_k + j`` (``num_pairs`` for padding);
    block ``b`` (entries ``b * block_m ...``) belongs to expert ``block_expert[b]`` (-1: empty)."""

    sorted_pairs: torch.Tensor
    block_expert: torch.Tensor
    block_m: int


def _max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Blocks of ``block_m`` that the padded runs can fill, from shapes only. Expert e's run
    takes ceil(c_e / block_m) < c_e / block_m + 1 blocks and at most min(pairs, experts)
    experts have pairs, so the runs take at most pairs // block_m + min(pairs, experts)
    blocks (the grouped GEMMs' grid: a decode step of 8 pairs over 128 experts gets 9 blocks,
    not 121 mostly empty ones)."""
    by_experts = (num_pairs + num_experts * (block_m - 1)) // block_m
    by_pairs = num_pairs // block_m + min(num_pairs, num_experts)
    return min(by_experts, by_pairs) + 1


def group_by_expert(ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertGroups:
    """Sort the pairs of ``ids [T, k]`` by expert on the device; sizes depend on shapes only.
    On CUDA up to ``ALIGN_MAX_PAIRS`` pairs take one Triton launch."""
    flat = ids.flatten().long()
    num_pairs = flat.numel()
    if triton is not None and ids.is_cuda and 0 < num_pairs <= ALIGN_MAX_PAIRS:
        return _group_by_expert_triton(flat, num_experts, block_m)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    first = counts.cumsum(0) - counts
    experts = flat[order]
    rank = torch.arange(num_pairs, device=ids.device) - first[experts]
    dest = padded_end[experts] - padded[experts] + rank
    max_blocks = _max_blocks(num_pairs, num_experts, block_m)
    sorted_pairs = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.long, device=ids.device)
    sorted_pairs.scatter_(0, dest, order)
    starts = torch.arange(max_blocks, device=ids.device) * block_m
    block_expert = torch.searchsorted(padded_end, starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return ExpertGroups(sorted_pairs, block_expert, block_m)


def _group_by_expert_triton(flat: torch.Tensor, num_experts: int, block_m: int) -> ExpertGroups:
    num_pairs = flat.numel()
    blocks = _max_blocks(num_pairs, num_experts, block_m)
    sorted_pairs = torch.empty(blocks * block_m, dtype=torch.long, device=flat.device)
    block_expert = torch.empty(blocks, dtype=torch.long, device=flat.device)
    block_p = next_pow2(num_pairs, 16)
    # NOTE: the pair and block counts are runtime arguments; only their powers of two
    # (BLOCK_P, BLOCK_B) compile new variants as decode batches grow.
    _ALIGN((1,), (flat, sorted_pairs, block_expert, num_pairs, blocks),
           NUM_EXPERTS=num_experts, BLOCK_P=block_p, BLOCK_E=next_pow2(num_experts, 16),
           BLOCK_M=block_m, BLOCK_B=next_pow2(blocks, 16),
           num_warps=8 if block_p >= 128 else 4)
    return ExpertGroups(sorted_pairs, block_expert, block_m)


@dataclass(frozen=True)
class MoeTile:
    """One grouped GEMM's launch: output features and reduction per step, warps, stages."""

    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 2


DEFAULT_TILE = MoeTile()
_IEEE_TILE = MoeTile(32, 32)  # float32 operands: smaller tiles keep the registers in bounds
# (kernel, hidden, intermediate, FP8 experts, pair bucket) -> the measured tile; pair buckets
# are those of pair_bucket (decode), larger batches take DEFAULT_TILE. Measured on an H200 by
# scripts/moe_sweep.py, which prints this dict (2026-12-01, Qwen3-30B-A3B's experts; the whole
# fused_moe call, default tiles -> these, us: 1 token bf16 52.6 -> 30.4, FP8 60.8 -> 30.2;
# 8 tokens bf16 131.1 -> 121.9, FP8 149.0 -> 92.7; 32 tokens bf16 301.3 -> 282.7, FP8 288.6 ->
# 211.6).
MOE_TILES: dict[tuple[str, int, int, bool, int], MoeTile] = {
    ("gate_up", 2048, 768, False, 8): MoeTile(32, 128, 4, 4),
    ("down", 2048, 768, False, 8): MoeTile(32, 64, 4, 4),
    ("gate_up", 2048, 768, True, 8): MoeTile(32, 128, 4, 4),
    ("down", 2048, 768, True, 8): MoeTile(32, 256, 4, 4),
    ("gate_up", 2048, 768, False, 64): MoeTile(32, 128, 4, 4),
    ("down", 2048, 768, False, 64): MoeTile(64, 128, 4, 2),
    ("gate_up", 2048, 768, True, 64): MoeTile(32, 128, 4, 4),
    ("down", 2048, 768, True, 64): MoeTile(64, 128, 4, 4),
    ("gate_up", 2048, 768, False, 256): MoeTile(32, 128, 4, 4),
    ("down", 2048, 768, False, 256): MoeTile(64, 128, 4, 2),
    ("gate_up", 2048, 768, True, 256): MoeTile(32, 128, 4, 4),
    ("down", 2048, 768, True, 256): MoeTile(64, 128, 4, 4),
}


# The two-launch decode kernels (moe_decode) per (FP8 experts, up to this many (token, expert)
# pairs): (gate_up tile, down tile); fused_moe_triton takes them at the smallest bucket that
# holds a step's pairs, the grouped GEMMs past the largest. Measured on an H200 (2026-12-01,
# scripts/moe_sweep.py --decode, Qwen3-30B-A3B's experts, us per call, grouped -> decode): 1
# token bf16 30.5 -> 29.4, FP8 30.2 -> 22.8; 4 tokens bf16 77.7 -> 72.5, FP8 65.6 -> 51.6 (8 x
# 256 tiles); 8 tokens bf16 133.0 -> 124.4, FP8 101.0 -> 78.5; 16 tokens FP8 145.6 -> 136.0 (32
# x 128 tiles, 8 warps); 16 tokens bf16 stay grouped (191.9 against 215.7 for the decode
# kernels). The down kernel's tile holds all top-k experts ([k, block_n, block_k]).
_NARROW, _WIDE = DecodeTile(8, 256, 4, 3), DecodeTile(32, 128, 8, 3)
_ONE_DOWN = DecodeTile(4, 256, 4, 4)
_WIDE_DOWN = DecodeTile(8, 64, 8, 2)
_FP8_DOWN = DecodeTile(8, 128, 4, 4)
DecodeTiles = tuple[DecodeTile, DecodeTile]
# Down tiles (scripts/moe_sweep.py --down, 2026-12-01, whole call with the gate_up tile above):
# 1 token bf16 4x256 w4 s4 24.40 us (8x128 w4 s3 26.45), FP8 17.11; 2-4 tokens bf16 8x64 w8 s2
# 38.22 / 71.36, FP8 8x128 w4 s2 27.10 / 49.48; 8 tokens bf16 8x64 w8 s2 125.46, FP8 8x128 w4
# s4 80.75. (Before the down kernel took all experts in one tile: 29.4 us at 1 token bf16.)
DECODE_TILES: dict[tuple[bool, int], DecodeTiles] = {
    (False, 8): (_NARROW, _ONE_DOWN),
    (False, 32): (_NARROW, _WIDE_DOWN),
    (False, 64): (_WIDE, _WIDE_DOWN),
    (True, 8): (_NARROW, _ONE_DOWN),
    (True, 32): (_NARROW, DecodeTile(8, 128, 4, 2)),
    (True, 64): (_WIDE, _FP8_DOWN),
    (True, 128): (_WIDE, _FP8_DOWN),
}


_DECODE_BUCKETS = {fp8: sorted(b for f, b in DECODE_TILES if f == fp8) for fp8 in (False, True)}


def decode_tile(num_pairs: int, fp8: bool) -> DecodeTiles | None:
    """The decode kernels' (gate_up, down) tiles for a step of ``num_pairs`` pairs; None: the
    grouped GEMMs."""
    for bucket in _DECODE_BUCKETS[fp8]:
        if num_pairs <= bucket:
            return DECODE_TILES[(fp8, bucket)]
    return None


def pair_bucket(num_pairs: int) -> int:
    """The (token, expert) pair counts tiles are chosen for: up to 8, 64 or 256 pairs; 0 above."""
    for bucket in (8, 64, 256):
        if num_pairs <= bucket:
            return bucket
    return 0


def moe_tiles(num_pairs: int, hidden: int, inter: int, dtype: torch.dtype, fp8: bool
              ) -> tuple[MoeTile, MoeTile]:
    """The (gate_up, down) tiles for a launch."""
    if dtype == torch.float32:
        return _IEEE_TILE, _IEEE_TILE
    bucket = pair_bucket(num_pairs)
    return (MOE_TILES.get(("gate_up", hidden, inter, fp8, bucket), DEFAULT_TILE),
            MOE_TILES.get(("down", hidden, inter, fp8, bucket), DEFAULT_TILE))


def fused_moe_triton(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    scales: Scales = None,
    tiles: tuple[MoeTile, MoeTile] | None = None,
    decode: bool | None = None,
) -> torch.Tensor:
    """``fused_moe`` on CUDA (or Triton's interpreter): the decode kernels where ``decode_tile``
    gives a tile (``decode=None``; ``decode=True`` always), else, or with ``decode=False``,
    the grouped GEMMs with ``tiles`` (default: ``moe_tiles``)."""
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = gate_up.shape
    inter = two_inter // 2
    top_k = ids.shape[1]
    num_pairs = num_tokens * top_k
    if num_pairs == 0:
        return torch.zeros_like(x)
    x = x.contiguous()
    gate_up, down = gate_up.contiguous(), down.contiguous()
    tiles_decode = decode_tile(num_pairs, scales is not None) if decode is not False else None
    if decode and tiles_decode is None:
        tiles_decode = (_WIDE, _WIDE_DOWN)
    if tiles_decode is not None:
        return fused_moe_decode(x, weights, ids, gate_up, down, scales, tiles_decode)
    ieee = x.dtype == torch.float32
    fp8 = scales is not None
    block_m = 16 if num_pairs <= 64 * num_experts else 64
    gu, dn = tiles or moe_tiles(num_pairs, hidden, inter, x.dtype, fp8)
    groups = group_by_expert(ids, num_experts, block_m)
    num_blocks = groups.block_expert.shape[0]
    gate_up_scale, down_scale = scales if fp8 else (x, x)  # unused without FP8
    h = torch.empty((num_pairs, inter), dtype=x.dtype, device=x.device)
    _GATE_UP(
        (num_blocks, triton.cdiv(inter, gu.block_n)),
        (
            x, gate_up, h, groups.sorted_pairs, groups.block_expert, gate_up_scale, num_pairs,
            x.stride(0), gate_up.stride(0), gate_up.stride(1), h.stride(0),
        ),
        TOP_K=top_k, HIDDEN=hidden, INTER=inter, BLOCK_M=block_m, BLOCK_N=gu.block_n,
        BLOCK_K=min(gu.block_k, max(16, next_pow2(hidden))), IEEE=ieee, FP8=fp8,
        num_warps=gu.num_warps, num_stages=gu.num_stages,
    )  # fmt: skip
    per_pair = torch.empty((num_pairs, hidden), dtype=x.dtype, device=x.device)
    route_weights = weights.contiguous().view(-1)
    _DOWN(
        (num_blocks, triton.cdiv(hidden, dn.block_n)),
        (
            h, down, per_pair, groups.sorted_pairs, groups.block_expert, route_weights,
            down_scale, num_pairs, h.stride(0), down.stride(0), down.stride(1),
            per_pair.stride(0),
        ),
        HIDDEN=hidden, INTER=inter, BLOCK_M=block_m, BLOCK_N=dn.block_n,
        BLOCK_K=min(dn.block_k, max(16, next_pow2(inter))), IEEE=ieee, FP8=fp8,
        num_warps=dn.num_warps, num_stages=dn.num_stages,
    )  # fmt: skip
    return per_pair.view(num_tokens, top_k, hidden).sum(dim=1)


def fused_moe(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    scales: Scales = None,
) -> torch.Tensor:
    """Experts ``gate_up [E, 2I, H]`` (rows [gate | up]) and ``down [E, H, I]`` applied to
    ``x [T, H]`` with the router's ``weights`` and ``ids`` ``[T, k]``. With ``scales`` the
    experts are e4m3 and row ``r`` of expert ``e`` stands for ``w[e, r] * scale[e, r]``."""
    if triton is not None and x.is_cuda:
        return fused_moe_triton(x, weights, ids, gate_up, down, scales)
    return fused_moe_reference(x, weights, ids, gate_up, down, scales)


class Experts(nn.Module):
    def __init__(self, arch: DecoderArch) -> None:
        super().__init__()
        e, h, i = arch.num_experts, arch.hidden_size, arch.moe_intermediate_size
        # Per expert, rows [gate | up] (the loader fills each expert's slices).
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))
        # FP8 experts (--quantization fp8): each row's scale; None in the model dtype.
        self.gate_up_scale: nn.Parameter | None = None
        self.down_scale: nn.Parameter | None = None

    @property
    def scales(self) -> Scales:
        if self.gate_up_scale is None or self.down_scale is None:
            return None
        return self.gate_up_scale, self.down_scale


class SparseMoE(nn.Module):
    """The MLP of a mixture-of-experts layer: router (``gate``) and experts."""

    def __init__(self, arch: DecoderArch) -> None:
        super().__init__()
        self.top_k = arch.num_experts_per_tok
        self.renormalize = arch.norm_topk_prob
        self.gate = nn.Linear(arch.hidden_size, arch.num_experts, bias=False)
        self.experts = Experts(arch)
        # Tensor parallelism: every rank routes alike (the router is whole) and holds a slice
        # of each expert's intermediate channels; the partial outputs sum over the ranks.
        self.tp = arch.tp_size > 1
        # route_fused's per-token counters (zeroed by reset_buffers after to_empty).
        self.register_buffer("route_counter", torch.zeros(ROUTER_MAX_TOKENS, dtype=torch.int32),
                             persistent=False)

    def reset_buffers(self) -> None:
        self.route_counter.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route_hidden(x, self.gate, self.top_k, self.renormalize,
                                    self.route_counter)
        out = fused_moe(x, weights, ids, self.experts.gate_up_proj, self.experts.down_proj,
                        self.experts.scales)
        return all_reduce(out) if self.tp else out
