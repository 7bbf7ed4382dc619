"""EngineCore: the scheduler and the model runner in one loop (vLLM v1 ``EngineCore``)."""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

import torch

from cadence.config import AUTO_MAX_MODEL_LEN, EngineConfig
from cadence.core_types import EngineCoreOutputs, EngineCoreRequest, SchedulerStats
from cadence.engine.engine_args import EngineArgs
from cadence.engine.request_checks import check_request_fits
from cadence.envs import read_envs
from cadence.model.arch import DecoderArch
from cadence.model.attention_backend import make_attention_backend
from cadence.model.dtypes import approx_num_params, resolve_dtype
from cadence.model.parallel import check_tensor_parallel
from cadence.model.registry import ModelSpec, resolve_model
from cadence.model.rope import longrope_switch_len
from cadence.profiling import nvtx_range
from cadence.runner_output import AsyncModelRunnerOutput
from cadence.scheduler.async_scheduler import AsyncScheduler
from cadence.scheduler.kv_cache_manager import make_block_hasher
from cadence.scheduler.output import SchedulerOutput
from cadence.scheduler.request import Request, RequestStatus
from cadence.scheduler.scheduler import Scheduler
from cadence.scheduler.stall import SchedulerStalledError, stall_reason
from cadence.torch_profiler import OFF, TorchProfiler
from cadence.worker.model_runner import ModelRunner
from cadence.worker.worker_rpc import decode_call, encode_result, run_on_worker

logger = logging.getLogger(__name__)

# The longest the engine thread blocks on a compiling grammar before it looks at its inputs again.
_GRAMMAR_WAIT_S = 0.05


class EarlyAborts:
    """Abort ids handed to the core by the thread that receives them (``EngineCoreProc.send``),
    each batch until the loop handles its queued copy (``discard``), or until a step takes it
    before its update (``take``; vLLM's aborts queue). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, list[str]] = {}
        self._next = 0

    def add(self, request_ids: list[str]) -> int:
        with self._lock:
            token = self._next
            self._next += 1
            self._pending[token] = list(request_ids)
            return token

    def discard(self, token: int) -> None:
        with self._lock:
            self._pending.pop(token, None)

    def take(self) -> list[str]:
        with self._lock:
            if not self._pending:
                return []
            taken = [rid for ids in self._pending.values() for rid in ids]
            self._pending.clear()
            return taken


class EngineCore:
    def __init__(self, args: EngineArgs, spec: ModelSpec | None = None) -> None:
        from cadence.model.loader import build_model

        self.args = args
        self.spec = spec or resolve_model(args.model, args.max_model_len, args.tokenizer,
                                          args.generation_config, args.hf_overrides,
                                          args.override_generation_config)
        self.config = args.create_engine_config(self.spec.max_model_len)
        cfg = self.config
        device = torch.device(cfg.device)
        self.dtype = resolve_dtype(cfg.model.dtype, cfg.device)
        torch.manual_seed(args.seed)
        if cfg.device == "cpu":
            # NOTE: torch's thread count is process-wide; the CPU backend owns it.
            threads = args.resolve_cpu_threads(approx_num_params(self.spec.hf_config))
            torch.set_num_threads(threads)
            logger.info("CPU backend: %d torch thread(s).", threads)
        tp_size = cfg.parallel.tensor_parallel_size
        if tp_size > 1:
            from cadence.worker.tp_executor import TPExecutor

            check_tensor_parallel(DecoderArch.from_hf_config(self.spec.hf_config), tp_size)
            # Each rank's CPU threads: a share of this process's, not all of them each.
            self.runner: ModelRunner | TPExecutor = TPExecutor(
                cfg, self.spec, self.dtype, args.seed, max(1, torch.get_num_threads() // tp_size))
        else:
            backend = make_attention_backend(cfg.device)
            model = build_model(self.spec, self.dtype, device, cfg.model.load_format, backend,
                                args.seed, quantization=cfg.model.quantization)
            self.runner = ModelRunner(cfg, self.spec, model, self.dtype, device)
        try:
            self.num_kv_blocks = self.runner.determine_num_kv_blocks()
            if args.max_model_len == AUTO_MAX_MODEL_LEN:
                self.config = cfg = self._fit_max_model_len(cfg)
            self.runner.initialize_kv_cache(self.num_kv_blocks)
            if cfg.use_graphs:
                self.runner.capture_graphs()
            sched_cls = AsyncScheduler if cfg.scheduler.async_scheduling else Scheduler
            # Prompts are hashed for the prefix cache after their step launches (see step).
            self.scheduler: Scheduler = sched_cls(
                cfg.scheduler, cfg.cache, self.num_kv_blocks, defer_prefix_caching=True,
                rope_switch_len=longrope_switch_len(self.spec.hf_config,
                                                   cfg.scheduler.max_model_len))
        except BaseException:
            self.runner.close()  # NOTE: worker processes and streams do not outlive a failed start
            raise
        self._block_hasher = (make_block_hasher(cfg.cache.block_size)
                              if cfg.cache.enable_prefix_caching else None)
        self.batch_queue_size = cfg.scheduler.max_concurrent_batches
        self.batch_queue: deque[tuple[AsyncModelRunnerOutput, SchedulerOutput]] = deque()
        self.early_aborts = EarlyAborts()
        self._compiling: set[Future] = set()  # grammars of waiting requests, not yet compiled
        envs = read_envs()
        self.profiler = TorchProfiler(envs.torch_profiler_dir, cfg.device == "cuda",
                                      options=envs.torch_profiler_options)
        logger.info(
            "Engine: model=%s arch=%s device=%s dtype=%s max_model_len=%d max_num_seqs=%d "
            "max_num_batched_tokens=%d kv_blocks=%d block_size=%d prefix_caching=%s policy=%s",
            cfg.model.model, self.spec.architecture, cfg.device, self.dtype,
            cfg.scheduler.max_model_len, cfg.scheduler.max_num_seqs,
            cfg.scheduler.max_num_batched_tokens, self.num_kv_blocks, cfg.cache.block_size,
            cfg.cache.enable_prefix_caching, cfg.scheduler.policy)
        # Start-up objects (KV block lists, weights' wrappers) live forever: keep them out of
        # the garbage collector's generations so its passes stay short on the hot path.
        gc.collect()
        gc.freeze()
        logger.info("Asynchronous scheduling is %s.",
                    "enabled" if cfg.scheduler.async_scheduling else "disabled")
        held = (self.num_kv_blocks - 1) * cfg.cache.block_size  # block 0: the null block
        if held < cfg.scheduler.max_model_len:
            # vLLM refuses to start here; this engine serves what fits and refuses the rest
            # per request, naming the bound (request_checks, the input processor).
            logger.warning(
                "The KV cache holds %d tokens, fewer than max_model_len=%d: a request needing "
                "more is refused. Lower max_model_len, or give the cache more memory "
                "(gpu_memory_utilization, num_gpu_blocks_override).",
                held, cfg.scheduler.max_model_len)

    def _fit_max_model_len(self, cfg: EngineConfig) -> EngineConfig:
        """vLLM's ``max_model_len="auto"``: the model's context where one request of it fits the
        KV cache, else the tokens the cache holds (block 0 is the null block). Before the
        scheduler exists; the runner keeps the buffers it sized for the longer context."""
        held = (self.num_kv_blocks - 1) * cfg.cache.block_size
        derived = cfg.scheduler.max_model_len
        if held >= derived:
            return cfg
        logger.warning("Auto-fit max_model_len: reduced from %d to %d, the tokens the KV cache "
                       "holds (%d blocks of %d).", derived, held, self.num_kv_blocks - 1,
                       cfg.cache.block_size)
        return dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, max_model_len=held),
            scheduler=dataclasses.replace(cfg.scheduler, max_model_len=held))

    # Properties the front ends read ----------------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return self.config.scheduler.max_model_len

    @property
    def vocab_size(self) -> int:
        return int(self.spec.hf_config.vocab_size)

    @property
    def block_size(self) -> int:
        return self.config.cache.block_size

    @property
    def num_free_kv_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    # Requests --------------------------------------------------------------------------------
    def validate_request(self, req: EngineCoreRequest) -> None:
        """Checks that need the engine's state; raises ValueError naming the parameter. An
        unset max_tokens becomes what the context and the KV cache allow (the input
        processor's rule, for clients that send it unset)."""
        if not req.prompt_token_ids:  # nothing to schedule: no step could ever take it
            raise ValueError("prompt: the prompt cannot be empty.")
        params = req.sampling_params
        if params.max_tokens is None:
            cache_tokens = (self.num_kv_blocks - 1) * self.block_size  # block 0 is the null one
            room = min(self.config.scheduler.max_model_len, cache_tokens + 1)
            params.max_tokens = max(room - len(req.prompt_token_ids), 1)
        check_request_fits(req, self.num_kv_blocks, self.block_size)

    def add_request(self, req: EngineCoreRequest) -> None:
        self.validate_request(req)
        grammar_ready = None
        spec = req.sampling_params.structured_outputs
        # Tensor-parallel ranks compile their grammars themselves, on admission.
        prefetch = getattr(self.runner, "prefetch_grammar", None)
        if spec is not None and prefetch is not None:
            # NOTE: compiled on the compiler's thread; the scheduler holds the request back
            # until then while the others run on.
            compiled = prefetch(spec)
            if not compiled.done():
                self._compiling.add(compiled)
                grammar_ready = compiled.done
        self.scheduler.add_request(Request(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            sampling_params=req.sampling_params,
            eos_token_id=req.eos_token_id,
            arrival_time=req.arrival_time,
            priority=req.priority,
            block_hasher=self._block_hasher,
            grammar_ready=grammar_ready,
            cache_salt=req.cache_salt,
        ))

    def set_failure_callback(self, callback) -> None:
        """``callback(error)`` runs (on another thread) when the engine fails outside a step:
        a tensor-parallel worker that exits. Without workers it never runs."""
        register = getattr(self.runner, "set_failure_callback", None)
        if register is not None:
            register(callback)

    def abort_requests(self, request_ids: list[str]) -> None:
        # Idempotent: unknown and already-finished ids are ignored by the scheduler.
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def _apply_early_aborts(self) -> None:
        """Aborts that arrived while a step ran, applied before its update (vLLM): an aborted
        request gets none of the step's tokens. Their queued copies find them finished."""
        request_ids = self.early_aborts.take()
        if request_ids:
            self.abort_requests(request_ids)

    def has_work(self) -> bool:
        return self.scheduler.has_requests() or bool(self.batch_queue)

    def make_stats(self) -> SchedulerStats:
        return self.scheduler.make_stats()

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached prefix (vLLM's; e.g. after the weights changed). False while
        requests hold blocks, unless ``reset_running_requests`` preempts them first."""
        return self.scheduler.reset_prefix_cache(reset_running_requests)

    # Steps -----------------------------------------------------------------------------------
    @property
    def step_fn(self):
        return self.step_with_batch_queue if self.batch_queue_size > 1 else self.step

    def step(self) -> tuple[EngineCoreOutputs, bool]:
        """Schedule, run, sample, then update: one synchronous step."""
        if not self.scheduler.has_requests():
            return EngineCoreOutputs(), False
        with nvtx_range("schedule"):
            so = self.scheduler.schedule()
        if so.total_num_scheduled_tokens == 0 and not so.preempted_req_ids:
            self._check_stall()
        pending = self.runner.execute_model(so)
        self.scheduler.flush_deferred_caching()  # while the step runs
        output = pending.get_output()
        self._apply_early_aborts()
        with nvtx_range("update"):
            outs = self.scheduler.update_from_output(so, output)
        return outs, so.total_num_scheduled_tokens > 0

    def step_with_batch_queue(self) -> tuple[EngineCoreOutputs | None, bool]:
        """Launch batch N+1 before consuming batch N; block only on the oldest batch."""
        queue = self.batch_queue
        executed = False
        if self.scheduler.has_requests():
            with nvtx_range("schedule"):
                so = self.scheduler.schedule()
            if (so.total_num_scheduled_tokens == 0 and not so.preempted_req_ids
                    and not any(q.total_num_scheduled_tokens for _, q in queue)):
                self._check_stall()  # nothing scheduled now nor in flight
            pending = self.runner.execute_model(so)
            self.scheduler.flush_deferred_caching()  # while the step runs
            executed = so.total_num_scheduled_tokens > 0
            queue.appendleft((pending, so))
            if executed and len(queue) < self.batch_queue_size:
                return None, True
        elif not queue:
            return None, False
        pending, so = queue.pop()
        output = pending.get_output()
        self._apply_early_aborts()
        with nvtx_range("update"):
            outs = self.scheduler.update_from_output(so, output)
        return outs, executed

    def _check_stall(self) -> None:
        """Nothing was scheduled, preempted or in flight: raise if nothing ever will be."""
        self._compiling = {f for f in self._compiling if not f.done()}
        if self._compiling:
            # Only requests whose grammar compiles can run next: wait for one grammar (bounded,
            # so that new inputs and aborts are still read) instead of spinning on empty steps.
            wait(self._compiling, timeout=_GRAMMAR_WAIT_S, return_when=FIRST_COMPLETED)
            return
        reason = stall_reason(self.scheduler)
        if reason is not None:
            raise SchedulerStalledError(f"The engine cannot make progress: {reason}.")

    def profile(self, is_start: bool = True, profile_prefix: str | None = None) -> str | None:
        """vLLM's core utility: start the torch profiler, or stop it and write its trace (the
        trace's path; with tensor parallelism each rank profiles itself and writes its own,
        rank 0's path is returned). RuntimeError when profiling is off."""
        profiler = self.profiler
        if not profiler.enabled:
            raise RuntimeError(OFF)
        ranks = getattr(self.runner, "profile", None)  # TPExecutor: the model runs in the ranks
        if ranks is not None:
            return ranks(is_start, profile_prefix)
        if is_start:
            profiler.start(profile_prefix)
            return None
        return profiler.stop()

    def collective_rpc(self, method: str | Callable[..., Any], args: Sequence[Any] = (),
                       kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """vLLM's core utility: ``method`` on every worker between two steps (the model runner,
        or each tensor-parallel rank's), their results in rank order (``worker_rpc``)."""
        args, kwargs = tuple(args), dict(kwargs or {})
        fan_out = getattr(self.runner, "collective_rpc", None)  # TPExecutor
        if fan_out is not None:
            return fan_out(method, args, kwargs)
        return [run_on_worker(self.runner, method, args, kwargs)]

    def collective_rpc_encoded(self, payload: bytes) -> bytes:
        """``collective_rpc`` for a front end in another process: the call and its results
        pickled apart from the pipe's messages, so that what one side cannot rebuild fails
        this call only (``worker_rpc.encode_call``)."""
        return encode_result(self.collective_rpc(*decode_call(payload)))

    def shutdown(self) -> None:
        self.profiler.close()
        self.batch_queue.clear()
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()
