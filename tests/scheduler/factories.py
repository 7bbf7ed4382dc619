"""Builders for scheduler tests (the counterparts of vLLM's tests/v1/core/utils.py)."""

from __future__ import annotations

from cadence.config import CacheConfig, SchedulerConfig
from cadence.runner_output import ModelRunnerOutput
from cadence.sampling_params import SamplingParams
from cadence.scheduler.async_scheduler import AsyncScheduler
from cadence.scheduler.kv_cache_manager import make_block_hasher
from cadence.scheduler.output import SchedulerOutput
from cadence.scheduler.request import Request
from cadence.scheduler.scheduler import Scheduler

EOS_TOKEN_ID = 50256


def create_scheduler(
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 8192,
    enable_prefix_caching: bool = True,
    num_blocks: int = 10000,
    block_size: int = 16,
    max_model_len: int | None = None,
    async_scheduling: bool = False,
    enable_chunked_prefill: bool = True,
    policy: str = "fcfs",
    defer_prefix_caching: bool = False,
    long_prefill_token_threshold: int = 0,
    rope_switch_len: int = 0,
) -> Scheduler:
    if max_model_len is None:
        max_model_len = max_num_batched_tokens
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        policy=policy,
        async_scheduling=async_scheduling,
        enable_chunked_prefill=enable_chunked_prefill,
        long_prefill_token_threshold=long_prefill_token_threshold,
    )
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    cls = AsyncScheduler if async_scheduling else Scheduler
    return cls(scheduler_config, cache_config, num_blocks,
               defer_prefix_caching=defer_prefix_caching, rope_switch_len=rope_switch_len)


def create_requests(
    num_requests: int,
    num_tokens: int = 10,
    max_tokens: int = 16,
    stop_token_ids: list[int] | None = None,
    same_prompt: bool = False,
    block_size: int = 16,
    req_ids: list[str] | None = None,
    ignore_eos: bool = False,
    min_tokens: int = 0,
    priorities: list[int] | None = None,
    arrival_times: list[float] | None = None,
    starting_idx: int = 0,
    prompt_logprobs: int | None = None,
) -> list[Request]:
    """Request i has prompt ``[i] * num_tokens`` (``[starting_idx] * num_tokens`` if same_prompt)."""
    hasher = make_block_hasher(block_size)
    requests = []
    for i in range(num_requests):
        params = SamplingParams(
            ignore_eos=ignore_eos,
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            stop_token_ids=stop_token_ids,
            prompt_logprobs=prompt_logprobs,
        )
        token = starting_idx if same_prompt else i + starting_idx
        requests.append(
            Request(
                request_id=req_ids[i] if req_ids else f"{i + starting_idx}",
                prompt_token_ids=[token] * num_tokens,
                sampling_params=params,
                eos_token_id=EOS_TOKEN_ID,
                arrival_time=arrival_times[i] if arrival_times else float(i),
                priority=priorities[i] if priorities else 0,
                block_hasher=hasher,
            )
        )
    return requests


def runner_output(req_ids: list[str], sampled_token_ids: list[list[int]]) -> ModelRunnerOutput:
    return ModelRunnerOutput(
        req_ids=list(req_ids),
        req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
        sampled_token_ids=sampled_token_ids,
    )


def output_for(scheduler_output: SchedulerOutput, token_id: int | None = None) -> ModelRunnerOutput:
    """Every scheduled request samples: row i gets token ``i`` (or ``token_id``)."""
    req_ids = list(scheduler_output.num_scheduled_tokens)
    tokens = [[i if token_id is None else token_id] for i in range(len(req_ids))]
    return runner_output(req_ids, tokens)


def scheduled_ids(scheduler_output: SchedulerOutput) -> list[str]:
    return [r.req_id for r in scheduler_output.scheduled_new_reqs] + list(
        scheduler_output.scheduled_cached_reqs.req_ids
    )


def assert_scheduler_empty(scheduler: Scheduler) -> None:
    """No request, no queue entry, every usable block free with ref_cnt 0: nothing leaked."""
    assert len(scheduler.requests) == 0
    assert len(scheduler.waiting) == 0
    assert len(scheduler.running) == 0
    kv = scheduler.kv_cache_manager
    assert len(kv.req_to_blocks) == 0
    assert len(kv.num_cached_block) == 0
    assert kv.block_pool.get_num_free_blocks() == kv.block_pool.num_blocks - 1
    for block in kv.block_pool.blocks:
        assert block.ref_cnt == 0
