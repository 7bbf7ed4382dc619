"""ModelRunner: turns a SchedulerOutput into one forward pass, samples, and hands tokens back.

Per step: apply the scheduler's delta to the persistent batch, prepare flat inputs on the host,
stage them into the persistent device buffers, let decode rows take their input id from the
device-resident ``last_sampled`` (combine), run the model (a CUDA-graph replay for decode-only
batches, eagerly otherwise), compute logits only for the rows that sample, sample, write the
sampled ids back into ``last_sampled`` (scatter), and start the copy of the sampled ids to the
host. That copy is consumed one step later (async scheduling) or at once.
"""

from __future__ import annotations

import logging
import math
import os
from concurrent.futures import Future
from typing import TYPE_CHECKING

import torch

from cadence.config import EngineConfig
from cadence.envs import read_envs
from cadence.graphs.sizes import dense_padding_ok
from cadence.graphs.tapes import TapedSteps
from cadence.model.dtypes import kv_cache_dtype
from cadence.model.fp8 import fp8_supported
from cadence.model.rope import longrope_switch_len
from cadence.numba_kernels.launcher import TokenBuffers, make_token_kernels
from cadence.profiling import nvtx_range
from cadence.runner_output import (
    NO_TOKEN,
    AsyncModelRunnerOutput,
    ModelRunnerOutput,
    ReadyOutput,
    WithFailedRequests,
)
from cadence.runtime import get_device
from cadence.sampling_params import StructuredOutputsParams
from cadence.scheduler.output import SchedulerOutput
from cadence.worker.async_output import OutputCopier
from cadence.worker.input_batch import InputBatch, StepInputs
from cadence.worker.kv_profile import profile_cuda_blocks
from cadence.worker.prompt_logprobs import WithPromptLogprobs
from cadence.worker.request_sampling import RequestSampling
from cadence.worker.sampler import Sampler
from cadence.worker.step_buffers import StepBuffers

if TYPE_CHECKING:
    from cadence.model.registry import ModelSpec

logger = logging.getLogger(__name__)

# Host memory the CPU backend gives the KV cache when no block count is forced.
_CPU_KV_CACHE_BYTES = 1 << 30


class ModelRunner:
    def __init__(self, config: EngineConfig, spec: ModelSpec, model: torch.nn.Module,
                 dtype: torch.dtype, device: torch.device, rank: int = 0) -> None:
        self.config = config
        # vLLM's worker attributes, for functions run on it (collective_rpc): the
        # tensor-parallel rank, on one host the local rank too; rank 0 drives.
        self.rank = self.local_rank = rank
        self.is_driver_worker = rank == 0
        self.spec = spec
        self.model = model
        self.dtype = dtype
        self.device = device
        self.kv_dtype = kv_cache_dtype(config.cache.cache_dtype, dtype)
        if self.kv_dtype != dtype and not fp8_supported(device):
            raise ValueError("kv_cache_dtype='fp8' needs FP8 support on the GPU (compute "
                             "capability 8.9 or newer).")
        sched = config.scheduler
        self.block_size = config.cache.block_size
        self.max_model_len = sched.max_model_len
        self.max_num_reqs = sched.max_num_seqs
        self.max_num_tokens = max(sched.max_num_batched_tokens, self.max_num_reqs)
        self.max_blocks_per_req = math.ceil(self.max_model_len / self.block_size)
        self.vocab_size = int(spec.hf_config.vocab_size)

        self.rt = get_device(device.type, device.index or 0)
        self.main = self.rt.create_stream()
        # NOTE: the copy stream only ever waits on the main stream; it is never captured.
        self.copy = self.rt.create_stream()

        self.input_batch = InputBatch(self.max_num_reqs, self.max_model_len,
                                      self.max_blocks_per_req, self.block_size)
        switch = longrope_switch_len(spec.hf_config, self.max_model_len)
        if switch:
            self.input_batch.rope_switch = (switch, model.rotary_emb.long_offset)
        self.sampler = Sampler(config.model.logprobs_mode)
        self.sampling = RequestSampling(self.input_batch, self.vocab_size, device,
                                        spec.tokenizer_path)
        self.kv_caches: list[torch.Tensor] = []
        self.buffers = StepBuffers(self.rt, self.main, self.max_num_tokens, self.max_num_reqs,
                                   self.max_blocks_per_req, device)
        self.input_batch.warm_up()  # the compiled host passes, before any request waits
        self.buffers.warm_up()
        self.sampler.warm_up(self.vocab_size, device, dtype)
        buf = self.buffers
        # GPU-resident last sampled token of every slot (DESIGN: combine / scatter).
        self.last_sampled = torch.zeros(self.max_num_reqs, dtype=torch.int64, device=device)
        self.sampled = torch.zeros(self.max_num_reqs, dtype=torch.int64, device=device)
        common = dict(input_ids=buf.input_ids, last_sampled=self.last_sampled,
                      last_token_index=buf.last_token_index, use_sampled=buf.use_sampled,
                      sampled=self.sampled, num_reqs=buf.counts[0:1],
                      num_sampled=buf.counts[1:2])
        self.combine_kernel = make_token_kernels(TokenBuffers(req_indices=buf.req_slots,
                                                              **common))
        self.scatter_kernel = make_token_kernels(TokenBuffers(req_indices=buf.sample_slots,
                                                              **common))
        self.copier = OutputCopier(self.rt, self.main, self.copy, self.max_num_reqs)
        self.graphs = None  # decode graphs by batch size (a GraphRunner) once captured
        self.mixed_graphs = None  # mixed-step graphs by token count, once captured
        # Mixed-step graphs of a lone prompt from position 0 (dense prefill attention).
        self.fresh_graphs = None
        self.capture_seconds = 0.0
        # Steps that sample every row and score no prompt token run their last layer past
        # the qkv projection for each row's last token only (model's ``rows``).
        self.output_rows = not read_envs().disable_output_rows
        # Eager decode steps replayed from launch tapes (by batch size), where no graph runs.
        self.tapes = (TapedSteps(device) if device.type == "cuda"
                      and not read_envs().disable_launch_tapes else None)

    # KV cache --------------------------------------------------------------------------------
    def kv_block_bytes(self) -> int:
        shape = self.model.kv_cache_shape(1, self.block_size)
        return math.prod(shape) * self.model.num_layers * self.kv_dtype.itemsize

    def determine_num_kv_blocks(self) -> int:
        override = self.config.cache.num_gpu_blocks_override
        if override is not None:
            self._check_override(override)
            return override
        size = self.config.cache.kv_cache_memory_bytes
        if size is not None:
            block_bytes = self.kv_block_bytes()
            blocks = size // block_bytes
            if blocks < 2:
                raise ValueError(
                    f"kv_cache_memory_bytes={size} holds {blocks} KV cache block(s) of "
                    f"{block_bytes} bytes; at least 2 are needed (block 0 is reserved)."
                )
            self._check_override(blocks, f"kv_cache_memory_bytes={size}")
            return blocks
        needed = self.max_num_reqs * self.max_blocks_per_req + 1
        if self.device.type == "cpu":
            return max(2, min(needed, _CPU_KV_CACHE_BYTES // self.kv_block_bytes()))
        return min(needed, self._profile_cuda_blocks())

    def _check_override(self, blocks: int, given: str | None = None) -> None:
        """A cache of ``blocks`` asked for (``given``: the setting that asked, the block
        override by default) that cannot fit in the device's free memory (the machine's
        physical memory on the CPU) is a configuration error, not an allocator's."""
        need = blocks * self.kv_block_bytes()
        if self.device.type == "cuda":
            free = torch.cuda.mem_get_info(self.device)[0]
        else:
            free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if need > free:
            raise ValueError(
                f"{given or f'num_gpu_blocks_override={blocks}'} needs {need / 2**30:.1f} GiB "
                f"of KV cache "
                f"({self.kv_block_bytes()} bytes a block) but the {self.device.type} has "
                f"{free / 2**30:.1f} GiB {'free' if self.device.type == 'cuda' else 'in all'}."
            )

    def _profile_cuda_blocks(self) -> int:
        return profile_cuda_blocks(
            self.model, self.buffers, self.main, self.kv_dtype, self.block_size,
            self.max_num_tokens, self.max_num_reqs, self.max_model_len, self.max_blocks_per_req,
            self.config.cache.gpu_memory_utilization, self.kv_block_bytes())

    def initialize_kv_cache(self, num_blocks: int) -> None:
        shape = self.model.kv_cache_shape(num_blocks, self.block_size)
        self.kv_caches = [torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
                          for _ in range(self.model.num_layers)]
        self.model.bind_kv_caches(self.kv_caches)
        if self.device.type == "cuda":
            # NOTE: deliberate start-up sync: the cache and the persistent buffers were zeroed on
            # torch's default stream, which our non-blocking main stream does not wait for.
            torch.cuda.synchronize(self.device)
        logger.info("KV cache: %d blocks of %d tokens (%.3f GiB, %s)", num_blocks, self.block_size,
                    num_blocks * self.kv_block_bytes() / 2**30, str(self.kv_dtype)[6:])

    # CUDA graphs -----------------------------------------------------------------------------
    def _decode_graph_step(self, rows: int) -> torch.Tensor:
        """What a decode graph holds: combine, the forward over ``rows`` one-token rows, logits."""
        buf = self.buffers
        self.combine_kernel.combine(self.main)
        md = buf.metadata(rows, rows, 1, self.max_blocks_per_req, self.max_model_len)
        hidden = self.model(buf.input_ids[:rows], buf.positions[:rows], md)
        return self.model.compute_logits(hidden, as_float=False)

    def _mixed_graph_step(self, tokens: int, fresh_prompt: bool = False) -> torch.Tensor:
        """What a mixed-step graph holds: combine and the forward over ``tokens`` tokens of up
        to ``mixed_rows(tokens)`` rows; it returns the hidden states (logits are taken after
        the replay, for the sampling rows only). ``fresh_prompt``: the graph only ever replays
        a lone prompt from position 0, attended densely where the backend can."""
        buf = self.buffers
        rows = self.mixed_rows(tokens)
        self.combine_kernel.combine(self.main)
        # max_query_len > 1 selects the varlen attention path, whose grid depends on shapes only.
        md = buf.metadata(tokens, rows, tokens, self.max_blocks_per_req, self.max_model_len,
                          fresh_prompt)
        # A fresh graph returns its prompt's last token only (``_fresh_rows``).
        out = (buf.output_rows(1, self.max_blocks_per_req, self.max_model_len)
               if fresh_prompt and self.output_rows else None)
        return self.model(buf.input_ids[:tokens], buf.positions[:tokens], md, out)

    def _fresh_graph_step(self, tokens: int) -> torch.Tensor:
        return self._mixed_graph_step(tokens, fresh_prompt=True)

    def mixed_rows(self, tokens: int) -> int:
        """Rows of a mixed graph of ``tokens`` tokens: as many requests as could fit."""
        return min(tokens, self.max_num_reqs)

    def capture_graphs(self) -> None:
        from cadence.graphs import (
            CudaGraphBackend,
            EagerGraphBackend,
            GraphRunner,
            capture_sizes,
            token_capture_sizes,
        )

        cfg = self.config.graphs
        backend = (CudaGraphBackend(self.main) if self.device.type == "cuda"
                   else EagerGraphBackend(self.main))
        self.buffers.fill_padding(self.max_num_tokens, self.max_num_reqs)
        mem_before = self._graph_memory()
        # EngineArgs caps max_capture_tokens at the step budget; a config built by hand may not.
        mixed_sizes = token_capture_sizes(min(cfg.max_capture_tokens, self.max_num_tokens))
        seconds = 0.0
        with torch.inference_mode():
            # Largest activations first: the mixed graphs, then decode (one shared pool).
            if mixed_sizes:
                self.mixed_graphs = GraphRunner(self._mixed_graph_step, mixed_sizes, backend)
                seconds += self.mixed_graphs.capture().seconds
            dense_min = self.model.dense_prefill_min_tokens(self.dtype, self.kv_dtype,
                                                            self.device)
            fresh_sizes = [s for s in mixed_sizes if dense_min is not None and s >= dense_min]
            if fresh_sizes:
                self.fresh_graphs = GraphRunner(self._fresh_graph_step, fresh_sizes, backend)
                seconds += self.fresh_graphs.capture().seconds
            self.graphs = GraphRunner(self._decode_graph_step,
                                      capture_sizes(self.max_num_reqs), backend)
            report = self.graphs.capture()
        seconds += report.seconds
        logger.info(
            "Captured %d decode graphs (batch 1-%d), %d mixed-step graphs (%s tokens) and %d of "
            "a lone fresh prompt in %.1f s, %.2f GiB of graph memory; kernels per decode "
            "graph: %s",
            len(report.sizes), report.sizes[-1], len(mixed_sizes),
            f"{mixed_sizes[0]}-{mixed_sizes[-1]}" if mixed_sizes else "no", len(fresh_sizes),
            seconds,
            (self._graph_memory() - mem_before) / 2**30,
            {s: report.kernels.get(s) for s in report.sizes[:3] + report.sizes[-1:]})
        self.capture_seconds = seconds

    def _graph_memory(self) -> int:
        if self.device.type != "cuda":
            return 0
        return torch.cuda.memory_reserved(self.device)

    def _buckets(self, inp: StepInputs) -> tuple[int | None, int | None, bool]:
        """(decode graph, mixed graph) bucket of a step, and whether the mixed bucket is a
        lone fresh prompt's graph; (None, None, False) runs it eagerly."""
        if inp.max_query_len == 1 and len(inp.sample_rows) == inp.num_reqs:
            if self.graphs is not None:
                return self.graphs.bucket_for(inp.num_reqs), None, False
        elif self.mixed_graphs is not None:
            t = inp.num_tokens
            if self.fresh_graphs is not None and inp.fresh_prompt and self._fresh_rows(inp):
                # A prompt a little below the dense minimum may pad into a fresh bucket: dense
                # attention at the bucket's size still beats the varlen kernel at the prompt's.
                size = self.fresh_graphs.bucket_for(t)
                if size is not None and dense_padding_ok(t, size):
                    return None, size, True
            return None, self.mixed_graphs.bucket_for(t), False
        return None, None, False

    def _fresh_rows(self, inp: StepInputs) -> bool:
        """Whether a fresh graph serves this lone prompt: its graph returns the prompt's last
        token alone, so a prompt whose tokens are scored takes a mixed graph."""
        return not self.output_rows or inp.req_ids[0] not in self.sampling.prompt_logprob_reqs

    def _eager_rows(self, inp: StepInputs) -> bool:
        """Whether an eager prefill step runs its last layer for each row's last token only:
        every row samples and none scores prompt tokens."""
        return (self.output_rows and inp.max_query_len > 1
                and len(inp.sample_rows) == inp.num_reqs
                and self.sampling.prompt_logprob_reqs.isdisjoint(inp.req_ids))

    def kernels_per_step(self, batch: int) -> int | None:
        if self.graphs is None:
            return None
        size = self.graphs.bucket_for(batch)
        return None if size is None else self.graphs.kernel_count(size)

    # Step ------------------------------------------------------------------------------------
    def _index(self, values: list[int]) -> torch.Tensor:
        t = torch.tensor(values, dtype=torch.int64)
        if self.device.type == "cuda":
            # NOTE: pinned and non-blocking: a pageable copy would wait for the GPU.
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def get_model(self) -> torch.nn.Module:
        """The model this runner steps (vLLM's worker ``get_model``: ``apply_model``'s)."""
        return self.model

    @property
    def model_runner(self) -> ModelRunner:
        """Itself: collective_rpc's worker is the runner here, where vLLM's worker holds one
        (so that ``lambda worker: worker.model_runner.model`` works as it does there)."""
        return self

    def prefetch_grammar(self, spec: StructuredOutputsParams) -> Future:
        """Start compiling a request's grammar off the engine thread (done once compiled)."""
        return self.sampling.grammar.prefetch(spec)

    def execute_model(self, so: SchedulerOutput) -> AsyncModelRunnerOutput:
        with self.main.context(), torch.inference_mode():
            out = self._execute(so)
        failed = self.input_batch.take_failed()
        failed.update(self.sampling.grammar.take_failed())
        failed.update(self.sampling.logits_state.take_failed())
        if failed:
            logger.warning("Requests refused by the model runner: %s", failed)
            return WithFailedRequests(out, failed)
        return out

    def _execute(self, so: SchedulerOutput) -> AsyncModelRunnerOutput:
        batch = self.input_batch
        with nvtx_range("prepare"):
            batch.apply(so)
            src, dst = batch.take_moves()
            if src:
                # Condensed rows carry their device-resident last token along (stream-ordered
                # after the scatter of the step that wrote it).
                src_t, dst_t = self._index(src), self._index(dst)
                self.last_sampled[dst_t] = self.last_sampled[src_t]
            self.sampling.update(so, src, dst)
            if so.total_num_scheduled_tokens == 0:
                return ReadyOutput(ModelRunnerOutput.empty())
            inp = batch.prepare(so)
            if inp.num_tokens == 0:  # every scheduled request was refused on admission
                return ReadyOutput(ModelRunnerOutput.empty())
            b, rows = inp.num_reqs, inp.sample_rows
            req_ids = inp.req_ids
            decode_bucket, mixed_bucket, fresh = self._buckets(inp)
            tape_key = None
            if decode_bucket is not None:
                self.buffers.upload(inp, decode_bucket, decode_bucket, metadata=False)
            elif mixed_bucket is not None:
                self.buffers.upload(inp, mixed_bucket, self.mixed_rows(mixed_bucket),
                                    metadata=False)
            elif (self.tapes is not None and inp.max_query_len == 1
                  and self.tapes.wants(inp.num_reqs)):
                # A tape freezes the decode kernel's grid: the graphs' full block-table width.
                tape_key = inp.num_reqs
                md = self.buffers.upload(inp, inp.num_tokens, inp.num_reqs)
            else:
                md = self.buffers.upload(inp)
        scored: dict = {}
        if decode_bucket is not None:
            # NOTE: a decode step scores no prompt token: a one-token chunk that samples is
            # the prompt's last position, which predicts the first output.
            with nvtx_range("replay"):
                logits = self.graphs.replay(decode_bucket)[:b]
        else:
            # Whether ``hidden`` holds each row's last token alone (``OutputRows``).
            row_states = fresh and self.output_rows
            if mixed_bucket is not None:
                graphs = self.fresh_graphs if fresh else self.mixed_graphs
                with nvtx_range("replay"):
                    hidden = graphs.replay(mixed_bucket)
            else:
                with nvtx_range("forward"):
                    self.combine_kernel.combine(self.main)
                    t = inp.num_tokens
                    row_states = self._eager_rows(inp)
                    last = (self.buffers.output_rows(b, md.block_tables.shape[1],
                                                     inp.max_seq_len) if row_states else None)

                    def forward() -> torch.Tensor:
                        return self.model(self.buffers.input_ids[:t], self.buffers.positions[:t],
                                          md, last)

                    hidden = forward() if tape_key is None else self.tapes.run(tape_key, forward)
            scored = self.sampling.score_prompts(inp, hidden, self.model.compute_logits)
            if len(rows) == 0:
                out = ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)},
                                        [[] for _ in req_ids])
                if not scored:
                    return ReadyOutput(out)
                # NOTE: nothing sampled, so no copy orders the scoring: wait for the stream.
                return WithPromptLogprobs(ReadyOutput(out), scored, self.main.synchronize)
            with nvtx_range("logits"):
                if row_states:  # every row samples: its own state, in row order
                    logits = self.model.compute_logits(hidden, as_float=False)
                else:
                    index = self.buffers.logits_index[: len(rows)].long()
                    logits = self.model.compute_logits(hidden[index], as_float=False)
        with nvtx_range("sample"):
            md = self.sampling.metadata(inp, self.last_sampled, self.copier.peek_last)
            sampled = self.sampler(logits, md)
            self.sampling.after_sampling(md, sampled.sampled_token_ids)
            n = len(rows)
            self.sampled[:n].copy_(sampled.sampled_token_ids)
            self.scatter_kernel.scatter(self.main)
            to_host = self.sampled
            if sampled.no_token is not None:  # masked steps only: the host sees NO_TOKEN
                to_host = torch.where(sampled.no_token, NO_TOKEN, self.sampled[:n])
        with nvtx_range("copy"):
            out = self.copier.start(req_ids, rows, to_host, n, sampled.logprobs)
            out = self.sampling.record_history(out, inp)
            return WithPromptLogprobs(out, scored) if scored else out

    def close(self) -> None:
        self.sampling.grammar.close()
        if self.copier is None:
            return
        self.main.synchronize()  # NOTE: a replay or copy may still be running
        for graphs in (self.graphs, self.mixed_graphs, self.fresh_graphs):
            if graphs is not None:
                graphs.close()
        self.graphs = self.mixed_graphs = self.fresh_graphs = None
        if self.tapes is not None:
            self.tapes.close()
        self.copier.close()
        self.copier = None
        self.buffers.close()
        self.main.close()
        self.copy.close()

