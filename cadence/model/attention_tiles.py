"""The tiles and split counts of the Triton attention kernels (``triton_attention``): each a
function of shapes only (batch, kv heads, block-table width, token bucket, dtype) and the
device, never of sequence lengths, so a CUDA graph captured with one stays right for every
later step it replays."""

from __future__ import annotations

from dataclasses import dataclass

from cadence.runtime.triton_launch import next_pow2

__all__ = [
    "EARLY_MAX_SEQS",
    "DecodeConfig",
    "VarlenConfig",
    "choose_num_splits",
    "decode_config",
    "varlen_config",
    "varlen_programs",
]

_MAX_SPLITS = 64
_MIN_TOKENS_PER_SPLIT = 64


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_context: int, num_sms: int, block_n: int = 64
) -> int:
    """Split-K factor for decode. Without splitting, ``num_seqs * num_kv_heads`` programs run;
    below two waves over the SMs, split until about four waves, with at least
    ``_MIN_TOKENS_PER_SPLIT`` context tokens per split; a power of two (few merge variants).

    Depends on shapes only (``max_context`` is the block table's capacity, not a sequence
    length), so a graph captured with it stays right for every later sequence length."""
    programs = num_seqs * num_kv_heads
    if programs >= 2 * num_sms:
        return 1
    want = -(-4 * num_sms // programs)
    cap = max(1, max_context // max(_MIN_TOKENS_PER_SPLIT, block_n))
    splits = min(want, cap, _MAX_SPLITS)
    return 1 if splits <= 1 else 1 << (splits.bit_length() - 1)


@dataclass(frozen=True)
class DecodeConfig:
    """Tile of the decode kernel: ``block_n`` keys per step of a program's loop, the launch's
    warps and pipeline stages, and ``early``: with the new K/V stored by the launch, request
    the step's metadata and the first tile of cached keys before the wait on the kernel before
    (a programmatic dependent launch), and use the new key and value from registers."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    early: bool = False

    def __post_init__(self) -> None:
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"block_n must be a power of two >= 16, got {self.block_n}")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(f"bad launch options: {self.num_warps} warps, "
                             f"{self.num_stages} stages")


# The most sequences the early load order takes after a qkv projection that releases early.
EARLY_MAX_SEQS = 8


def decode_config(fp32: bool, num_seqs: int = 0, pdl: bool = False,
                  qkv_releases_early: bool = False) -> DecodeConfig:
    """The decode tile: 32 keys per step in float32 (its registers), 64 otherwise. The early
    load order for 16-bit caches under programmatic dependent launches, for one sequence, and
    for up to ``EARLY_MAX_SEQS`` where the qkv projection before is a bulk kernel that releases
    its dependents (``qkv_releases_early``): there its loads overlap that projection's tail (the
    H200's batch-1 step 0.762 -> 0.721 ms; on an H100 after the bulk GEMM batch 2 1.225 -> 1.012
    ms, batch 8 1.274 -> 1.164, while batch 8 and 64 after a cuBLAS qkv lost 2% and 14%;
    docs/perf.md, runs NA, VA)."""
    if fp32:
        return DecodeConfig(block_n=32)
    early = num_seqs == 1 or (qkv_releases_early and 1 <= num_seqs <= EARLY_MAX_SEQS)
    return DecodeConfig(early=pdl and early)


@dataclass(frozen=True)
class VarlenConfig:
    """Tile of the varlen kernel: ``block_m`` rows (query tokens x the group's query heads,
    padded to a power of two) against ``block_n`` keys per step."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2

    def block_q(self, group: int) -> int:
        return max(1, self.block_m // next_pow2(group))


def varlen_config(num_tokens: int, fp32: bool) -> VarlenConfig:
    """The tile for a pass of ``num_tokens`` tokens: a function of shapes only, so a graph
    captured at a token bucket keeps it."""
    if fp32:
        return VarlenConfig(block_m=32, block_n=32)
    # From scripts/attention_sweep.py on the H200 (Qwen3-0.6B heads): 128 x 128 tiles lead at
    # 1024 and 4096 tokens (278 TFLOP/s at 4096), 64 x 64 with three stages at 128 tokens and
    # for a 512-token chunk beside 64 decodes.
    if num_tokens >= 1024:
        return VarlenConfig(block_m=128, block_n=128, num_warps=8, num_stages=3)
    return VarlenConfig(block_m=64, block_n=64, num_warps=4, num_stages=3)


def varlen_programs(
    num_tokens: int, block_q: int, num_seqs: int, num_kv_heads: int, num_sms: int | None
) -> int:
    """Programs per kv head of the varlen kernel. A pass of ``num_tokens`` tokens in
    ``num_seqs`` sequences has at most ``num_tokens // block_q + num_seqs`` query blocks (a
    graph's bucket counts its padding sequences too); each program walks every P-th of the
    blocks that exist. With ``num_sms``: about two programs per SM over the kv heads, and at
    least one per block of a single sequence (one long prompt keeps a program per block);
    without: one per possible block. At most 65535 (the grid's second axis)."""
    bound = min(max(1, num_tokens // block_q + num_seqs), 65535)  # a grid's y limit
    if num_sms is None:
        return bound
    want = max(-(-2 * num_sms // num_kv_heads), num_tokens // block_q + 1)
    return min(bound, want)
