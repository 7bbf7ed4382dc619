"""ModelRunner: turns a SchedulerOutput into one forward pass, samples, and hands tokens back.

Per step: apply the scheduler's delta to the persistent batch, prepare flat inputs on the host,
copy them into persistent device buffers, let decode rows take their input id from the
device-resident ``last_sampled`` (combine), run the model, compute logits only for the rows that
sample, sample, write the sampled ids back into ``last_sampled`` (scatter), and start the copy of
the sampled ids to the host. The host copy is consumed one step later (async scheduling) or at
once.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from cadence.config import EngineConfig
from cadence.model.attention_metadata import AttentionMetadata
from cadence.scheduler.output import SchedulerOutput
from cadence.worker.async_output import make_output_copier
from cadence.worker.input_batch import InputBatch, StepInputs
from cadence.worker.output import AsyncModelRunnerOutput, ModelRunnerOutput, ReadyOutput
from cadence.worker.sampler import Sampler, SamplingMetadata, seed_generator

logger = logging.getLogger(__name__)

# Host memory the CPU backend gives the KV cache when no block count is forced.
_CPU_KV_CACHE_BYTES = 1 << 30


class ModelRunner:
    def __init__(self, config: EngineConfig, spec, model: torch.nn.Module, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.config = config
        self.spec = spec
        self.model = model
        self.dtype = dtype
        self.device = device
        sched = config.scheduler
        self.block_size = config.cache.block_size
        self.max_model_len = sched.max_model_len
        self.max_num_reqs = sched.max_num_seqs
        self.max_num_tokens = sched.max_num_batched_tokens
        self.max_blocks_per_req = math.ceil(self.max_model_len / self.block_size)
        self.vocab_size = int(spec.hf_config.vocab_size)

        self.input_batch = InputBatch(self.max_num_reqs, self.max_model_len,
                                      self.max_blocks_per_req, self.block_size)
        self.sampler = Sampler()
        self.generators: dict[int, torch.Generator] = {}
        self.kv_caches: list[torch.Tensor] = []

        # Persistent device buffers: every step writes into these; nothing is allocated per step.
        dev = dict(device=device)
        self.input_ids = torch.zeros(self.max_num_tokens, dtype=torch.int64, **dev)
        self.positions = torch.zeros(self.max_num_tokens, dtype=torch.int64, **dev)
        self.slot_mapping = torch.zeros(self.max_num_tokens, dtype=torch.int64, **dev)
        self.query_start_loc = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, **dev)
        self.seq_lens = torch.zeros(self.max_num_reqs, dtype=torch.int32, **dev)
        self.block_tables = torch.zeros(self.max_num_reqs, self.max_blocks_per_req,
                                        dtype=torch.int32, **dev)
        self.req_slots = torch.zeros(self.max_num_reqs, dtype=torch.int32, **dev)
        self.last_token_index = torch.zeros(self.max_num_reqs, dtype=torch.int32, **dev)
        self.use_sampled = torch.zeros(self.max_num_reqs, dtype=torch.int32, **dev)
        # GPU-resident last sampled token of every slot (DESIGN: combine / scatter).
        self.last_sampled = torch.zeros(self.max_num_reqs, dtype=torch.int64, **dev)
        self.copier = make_output_copier(device, self.max_num_reqs)

    # KV cache --------------------------------------------------------------------------------
    def kv_block_bytes(self) -> int:
        shape = self.model.kv_cache_shape(1, self.block_size)
        return math.prod(shape) * self.model.num_layers * self.dtype.itemsize

    def determine_num_kv_blocks(self) -> int:
        override = self.config.cache.num_gpu_blocks_override
        if override is not None:
            return override
        needed = self.max_num_reqs * self.max_blocks_per_req + 1
        if self.device.type == "cpu":
            return max(2, min(needed, _CPU_KV_CACHE_BYTES // self.kv_block_bytes()))
        return self._profile_cuda_blocks()

    def _profile_cuda_blocks(self) -> int:
        """Run one maximal forward with no KV cache bound to find the peak activation memory."""
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._dummy_forward(self.max_num_tokens)
        torch.cuda.synchronize(self.device)  # NOTE: deliberate sync, start-up only
        peak = torch.cuda.max_memory_allocated(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        used_by_others = total - free - torch.cuda.memory_reserved(self.device)
        budget = total * self.config.cache.gpu_memory_utilization - used_by_others - peak
        blocks = int(budget // self.kv_block_bytes())
        if blocks < 2:
            raise ValueError(
                "No memory is left for the KV cache; raise gpu_memory_utilization or lower "
                "max_num_batched_tokens."
            )
        logger.info("KV cache: %d blocks of %d tokens (%.2f GiB)", blocks, self.block_size,
                    blocks * self.kv_block_bytes() / 2**30)
        return blocks

    def _dummy_forward(self, num_tokens: int) -> None:
        if not self.kv_caches:
            # A throwaway two-block cache: the dummy tokens all write to block 0.
            self._bind([torch.zeros(self.model.kv_cache_shape(2, self.block_size),
                                    dtype=self.dtype, device=self.device)
                        for _ in range(self.model.num_layers)])
            bound_here = True
        else:
            bound_here = False
        n = min(num_tokens, self.max_num_tokens)
        md = self._metadata(n, n, n, num_reqs=1)
        self.query_start_loc[:2] = torch.tensor([0, n], dtype=torch.int32)
        self.seq_lens[:1] = n
        self.slot_mapping[:n] = -1
        self.positions[:n] = torch.arange(n)
        with torch.inference_mode():
            hidden = self.model(self.input_ids[:n], self.positions[:n], md)
            self.model.compute_logits(hidden[-min(n, self.max_num_reqs):])
        if bound_here:
            self.kv_caches = []

    def _bind(self, caches: list[torch.Tensor]) -> None:
        self.kv_caches = caches
        self.model.bind_kv_caches(caches)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        shape = self.model.kv_cache_shape(num_blocks, self.block_size)
        self._bind([torch.zeros(shape, dtype=self.dtype, device=self.device)
                    for _ in range(self.model.num_layers)])

    # Step ------------------------------------------------------------------------------------
    def _metadata(self, num_tokens: int, max_query_len: int, max_seq_len: int,
                  num_reqs: int) -> AttentionMetadata:
        return AttentionMetadata(
            num_actual_tokens=num_tokens,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            query_start_loc=self.query_start_loc[: num_reqs + 1],
            seq_lens=self.seq_lens[:num_reqs],
            block_tables=self.block_tables[:num_reqs],
            slot_mapping=self.slot_mapping[:num_tokens],
        )

    def _copy_inputs(self, inp: StepInputs) -> AttentionMetadata:
        t, b = inp.num_tokens, inp.num_reqs
        nb = inp.block_tables.shape[1]
        # NOTE: host->device copies of this step's small index arrays; on CUDA they are ordered
        # on the main stream before the kernels that read them.
        _h2d(self.input_ids[:t], inp.input_ids)
        _h2d(self.positions[:t], inp.positions)
        _h2d(self.slot_mapping[:t], inp.slot_mapping)
        _h2d(self.query_start_loc[: b + 1], inp.query_start_loc)
        _h2d(self.seq_lens[:b], inp.seq_lens)
        _h2d(self.block_tables[:b, :nb], inp.block_tables)
        _h2d(self.req_slots[:b], inp.slots)
        _h2d(self.last_token_index[:b], inp.last_token_index)
        _h2d(self.use_sampled[:b], inp.use_sampled)
        md = self._metadata(t, inp.max_query_len, inp.max_seq_len, b)
        md.block_tables = self.block_tables[:b, :nb]
        md.query_start_loc_cpu = torch.from_numpy(inp.query_start_loc)
        md.seq_lens_cpu = torch.from_numpy(inp.seq_lens)
        return md

    def _combine(self, b: int) -> None:
        """Decode rows take their input id from the device-resident last sampled token."""
        use = self.use_sampled[:b].bool()
        idx = self.last_token_index[:b][use].long()
        self.input_ids[idx] = self.last_sampled[self.req_slots[:b][use].long()]

    def _sampling_metadata(self, inp: StepInputs) -> SamplingMetadata:
        batch = self.input_batch
        slots = inp.slots[inp.sample_rows]
        params = [batch.params[s] for s in slots]
        temps = np.array([p.temperature for p in params], dtype=np.float32)
        all_greedy = bool((temps == 0.0).all())
        top_p = np.array([p.top_p for p in params], dtype=np.float32)
        top_k = np.array([p.top_k for p in params], dtype=np.int64)
        generators: dict[int, torch.Generator] = {}
        banned: dict[int, list[int]] = {}
        max_logprobs: int | None = None
        for row, (slot, p) in enumerate(zip(slots, params)):
            # Index of the token being sampled among the request's outputs.
            out_index = int(batch.num_tokens[slot] - 1 - batch.num_prompt[slot])
            if p.seed is not None and not p.greedy:
                gen = self.generators.get(int(slot))
                if gen is None:
                    gen = self.generators[int(slot)] = torch.Generator(device=self.device)
                seed_generator(gen, p.seed, out_index)
                generators[row] = gen
            if out_index < p.min_tokens and p.all_stop_token_ids:
                banned[row] = sorted(p.all_stop_token_ids)
            if p.logprobs is not None:
                max_logprobs = max(max_logprobs or 0, p.logprobs)
        dev = self.device
        return SamplingMetadata(
            temperature=None if all_greedy else torch.from_numpy(temps).to(dev),
            all_greedy=all_greedy,
            all_random=bool((temps > 0.0).all()),
            top_p=torch.from_numpy(top_p).to(dev) if (top_p < 1.0).any() else None,
            top_k=torch.from_numpy(top_k).to(dev) if (top_k > 0).any() else None,
            generators=generators,
            max_num_logprobs=max_logprobs,
            banned_token_ids=banned,
        )

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> AsyncModelRunnerOutput:
        batch = self.input_batch
        batch.apply(so)
        for slot in list(self.generators):
            if batch.slot_req_ids[slot] is None:
                del self.generators[slot]
        if so.total_num_scheduled_tokens == 0:
            return ReadyOutput(ModelRunnerOutput.empty())
        inp = batch.prepare(so)
        md = self._copy_inputs(inp)
        b, t = inp.num_reqs, inp.num_tokens
        self._combine(b)
        hidden = self.model(self.input_ids[:t], self.positions[:t], md)

        rows = inp.sample_rows
        req_ids = inp.req_ids
        if len(rows) == 0:
            out = ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)},
                                    [[] for _ in req_ids])
            return ReadyOutput(out)
        logits_index = torch.from_numpy(inp.last_token_index[rows].astype(np.int64)).to(
            self.device)
        logits = self.model.compute_logits(hidden[logits_index])
        sampled = self.sampler(logits, self._sampling_metadata(inp))
        slots = torch.from_numpy(inp.slots[rows].astype(np.int64)).to(self.device)
        self.last_sampled[slots] = sampled.sampled_token_ids
        return self.copier.start(req_ids, rows, sampled)


def _h2d(dst: torch.Tensor, src: np.ndarray) -> None:
    dst.copy_(torch.from_numpy(src), non_blocking=True)
