"""Tensor parallelism inside the model: which shard of each weight a rank holds, and the
collectives (all-reduce after row-parallel layers, vocab-parallel embedding and logits).

Megatron's split: q/k/v and gate/up are column-parallel (each rank holds a contiguous run of
heads / intermediate channels), o_proj and down_proj row-parallel (each rank multiplies its run of
input channels; an all-reduce sums the partial outputs), the embedding and the LM head split the
vocabulary into equal (zero-padded) ranges. KV heads are split like the query heads, or
replicated when there are fewer of them than ranks. With one rank nothing here runs.

The collectives are ``torch.distributed``'s on the default process group (NCCL on CUDA: they are
captured inside CUDA graphs; gloo on the CPU), so every rank must make the same calls in the same
order: rank-dependent control flow around a forward pass is a deadlock. On CUDA, once
``setup_custom_all_reduce`` has run, small all-reduces take a one-shot kernel over peer-mapped
buffers instead (``custom_all_reduce``), captured in the graphs the same way.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from cadence.model.arch import DecoderArch

if TYPE_CHECKING:
    from cadence.model.custom_all_reduce import CustomAllReduce

logger = logging.getLogger(__name__)

# Families whose layers shard as above; others are refused under tensor parallelism.
TP_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Phi3ForCausalLM",
)


@dataclass(frozen=True)
class TPShard:
    """What rank ``rank`` of ``size`` holds of a model of architecture ``full``."""

    rank: int
    size: int
    num_heads: int  # query heads of this rank, from head rank * num_heads
    num_kv_heads: int  # KV heads of this rank, from head kv_head_start
    kv_head_start: int
    intermediate_size: int  # MLP channels of this rank, from rank * intermediate_size
    vocab_per_rank: int  # rows of the embedding / LM head shard (the last one zero-padded)
    full_kv_heads: int  # of the whole model

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_per_rank

    @classmethod
    def of(cls, full: DecoderArch, rank: int, size: int) -> TPShard:
        check_tensor_parallel(full, size)
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} outside a tensor-parallel group of {size}.")
        if full.num_kv_heads >= size:
            kv_heads = full.num_kv_heads // size
            kv_start = rank * kv_heads
        else:  # replicated: ranks rank * kv // size share one KV head
            kv_heads = 1
            kv_start = rank * full.num_kv_heads // size
        return cls(rank, size, full.num_heads // size, kv_heads, kv_start,
                   full.intermediate_size // size, -(-full.vocab_size // size),
                   full.num_kv_heads)

    def local_arch(self, full: DecoderArch) -> DecoderArch:
        """The shapes the layers of this rank are built with."""
        return dataclasses.replace(full, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                                   intermediate_size=self.intermediate_size,
                                   moe_intermediate_size=full.moe_intermediate_size // self.size,
                                   tp_size=self.size)


def check_tensor_parallel(arch: DecoderArch, size: int) -> None:
    """Raise ValueError in one line if ``arch`` cannot be split over ``size`` ranks."""
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {size}.")
    if size == 1:
        return
    if arch.architecture not in TP_ARCHITECTURES:
        raise ValueError(
            f"tensor_parallel_size={size}: {arch.architecture} is not supported under tensor "
            f"parallelism; supported: {', '.join(TP_ARCHITECTURES)}."
        )
    if arch.num_heads % size:
        raise ValueError(
            f"tensor_parallel_size={size} must divide the model's num_attention_heads "
            f"({arch.num_heads})."
        )
    kv = arch.num_kv_heads
    if (kv >= size and kv % size) or (kv < size and size % kv):
        raise ValueError(
            f"tensor_parallel_size={size} and num_key_value_heads ({kv}) must divide one another."
        )
    if any(arch.moe_layers) and arch.moe_intermediate_size % size:
        raise ValueError(
            f"tensor_parallel_size={size} must divide the experts' moe_intermediate_size "
            f"({arch.moe_intermediate_size})."
        )
    if arch.intermediate_size % size:
        raise ValueError(
            f"tensor_parallel_size={size} must divide the model's intermediate_size "
            f"({arch.intermediate_size})."
        )


# This process's one-shot all-reduce, once set up (a rank is one process).
_custom: CustomAllReduce | None = None


def setup_custom_all_reduce(device: torch.device, **options: object) -> CustomAllReduce | None:
    """Set up the one-shot all-reduce on ``device`` for the default process group where it can
    run (CUDA, 2 to 8 ranks on one host, every pair of GPUs peer-capable, not disabled by
    ``CADENCE_DISABLE_CUSTOM_ALL_REDUCE``); every rank calls this, after
    ``init_process_group`` and before any all-reduce. Returns it, or None (NCCL does all)."""
    global _custom
    from cadence.envs import read_envs
    from cadence.model.custom_all_reduce import CustomAllReduce, unavailable_reason

    close_custom_all_reduce()
    why = unavailable_reason(device.type, torch.distributed.get_world_size(),
                             read_envs().disable_custom_all_reduce)
    if why is not None:
        logger.info("Custom all-reduce off: %s.", why)
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    _custom = CustomAllReduce.create(index, **options)
    return _custom


def close_custom_all_reduce() -> None:
    """Free the one-shot all-reduce's buffers (collective: every rank calls it); idempotent."""
    global _custom
    car, _custom = _custom, None
    if car is not None:
        car.close()


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the ranks, in place."""
    car = _custom
    if car is not None and car.should_use(x):
        return car.all_reduce(x)
    torch.distributed.all_reduce(x)
    return x


def gather_vocab(local: torch.Tensor, shard: TPShard, vocab_size: int) -> torch.Tensor:
    """``[N, vocab_per_rank]`` on each rank -> ``[N, vocab_size]`` on every rank."""
    n = local.shape[0]
    out = torch.empty((shard.size * n, local.shape[1]), dtype=local.dtype, device=local.device)
    gather = getattr(torch.distributed, "all_gather_single", None)  # torch >= 2.10's name
    (gather or torch.distributed.all_gather_into_tensor)(out, local.contiguous())
    full = out.view(shard.size, n, -1).transpose(0, 1).reshape(n, -1)
    # Padded: drop the tail columns, contiguous for the sampler.
    return full if full.shape[1] == vocab_size else full[:, :vocab_size].contiguous()


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of the embedding table; ids of other ranks' rows embed to zero here,
    and the all-reduce fills them in."""

    def __init__(self, shard: TPShard, hidden_size: int) -> None:
        super().__init__()
        self.start = shard.vocab_start
        self.rows = shard.vocab_per_rank
        self.weight = nn.Parameter(torch.empty(self.rows, hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.rows)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        x = x.masked_fill(outside.unsqueeze(-1), 0.0)
        return all_reduce(x)
