"""How many KV-cache blocks a GPU holds: one forward of the largest step the scheduler can send,
with no cache kept, finds the peak activation memory; the cache gets what
``gpu_memory_utilization`` leaves after it and after other processes' memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from cadence.runtime.interfaces import StreamLike
    from cadence.worker.step_buffers import StepBuffers


def largest_step_layout(max_num_tokens: int, max_num_seqs: int, max_model_len: int) -> list[int]:
    """Sequence lengths of the largest step the scheduler can send: its token budget, split into
    at most ``max_num_seqs`` sequences of at most ``max_model_len`` tokens."""
    n = min(max_num_tokens, max_num_seqs * max_model_len)
    return [min(max_model_len, n - i) for i in range(0, n, max_model_len)]


def profile_cuda_blocks(
    model: torch.nn.Module, buffers: StepBuffers, main: StreamLike, kv_dtype: torch.dtype,
    block_size: int, max_num_tokens: int, max_num_reqs: int, max_model_len: int,
    max_blocks_per_req: int, utilization: float, block_bytes: int,
) -> int:
    """Run one maximal forward on ``main`` (no KV cache kept) to find the peak activation
    memory; the blocks of ``block_bytes`` that fit in what ``utilization`` leaves."""
    device = buffers.device
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    shape = model.kv_cache_shape(2, block_size)
    scratch = [torch.zeros(shape, dtype=kv_dtype, device=device) for _ in range(model.num_layers)]
    model.bind_kv_caches(scratch)
    # No KV write (slot -1); every sequence reads block 0 of the scratch cache.
    lens = largest_step_layout(max_num_tokens, max_num_reqs, max_model_len)
    n, rows = sum(lens), len(lens)
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    with main.context(), torch.inference_mode():
        buffers.query_start_loc[: rows + 1].copy_(qsl)
        buffers.seq_lens[:rows].copy_(seq_lens)
        buffers.block_tables[:rows].zero_()
        buffers.slot_mapping[:n].fill_(-1)
        md = buffers.metadata(n, rows, max(lens), max_blocks_per_req, max(lens))
        md.query_start_loc_cpu, md.seq_lens_cpu = qsl, seq_lens
        hidden = model(buffers.input_ids[:n], buffers.positions[:n], md)
        model.compute_logits(hidden[-max_num_reqs:])
    main.synchronize()  # NOTE: deliberate sync, start-up only
    del scratch, hidden
    peak = torch.cuda.max_memory_allocated(device)
    free, total = torch.cuda.mem_get_info(device)
    used_by_others = total - free - torch.cuda.memory_reserved(device)
    blocks = int((total * utilization - used_by_others - peak) // block_bytes)
    if blocks < 2:
        raise ValueError("gpu_memory_utilization: no memory is left for the KV cache; raise "
                         "it or lower max_num_batched_tokens.")
    return blocks
