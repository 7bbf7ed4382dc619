"""Seeded randomized property test (in the spirit of vLLM's test_priority_scheduler_random.py).

A simulated engine drives the scheduler for thousands of steps with random arrivals,
priorities, prompts sharing prefixes, sampled tokens, aborts and forced prefix-cache resets, on
a KV cache small enough to preempt often, for both policies, with async scheduling on (two
steps in flight) and off. A mirror of the model runner rebuilds every request's state from the
scheduler outputs alone, writes each computed token into a simulated paged KV cache and checks
that every position a step attends to holds the right token. The fake model's next token
depends only on (request, output index), so every request that was not aborted must end with
exactly the tokens and finish reason that check_stop's rules give.

With deferred prefix caching (as the engine runs it) the blocks a step fills enter the cache
when the engine flushes them after the launch, or at the next lookup or free: the same
workload must then give the same scheduler outputs, block for block, with flushes after every
step, after some, or after none.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from cadence.runner_output import ModelRunnerOutput
from cadence.sampling_params import SamplingParams
from cadence.scheduler.kv_cache_manager import make_block_hasher
from cadence.scheduler.output import SchedulerOutput
from cadence.scheduler.request import FinishReason, Request, RequestStatus
from cadence.scheduler.scheduler import Scheduler
from tests.scheduler.factories import assert_scheduler_empty, create_scheduler

EOS = 0
STOP_ID = 7
VOCAB = 40
BLOCK_SIZE = 4
MAX_MODEL_LEN = 64


def model_token(req_id: str, index: int) -> int:
    """The fake model: a fixed token per (request, output index)."""
    h = zlib.crc32(f"{req_id}:{index}".encode())
    return EOS if h % 29 == 0 else 1 + h % (VOCAB - 1)


def expected_output(request: Request) -> tuple[list[int], FinishReason, int | None]:
    """Tokens, finish reason and stop reason that the stop rules give for ``request``."""
    params = request.sampling_params
    assert params.max_tokens is not None
    tokens: list[int] = []
    while True:
        token = model_token(request.request_id, len(tokens))
        tokens.append(token)
        n = len(tokens)
        if n >= params.min_tokens:
            if token == EOS and not params.ignore_eos:
                return tokens, FinishReason.STOP, None
            if token in params.stop_token_ids:
                return tokens, FinishReason.STOP, token
            if n >= params.max_tokens:
                return tokens, FinishReason.LENGTH, None
        if request.num_prompt_tokens + n >= MAX_MODEL_LEN:
            return tokens, FinishReason.LENGTH, None


@dataclass
class RunnerState:
    tokens: list[int]
    num_prompt_tokens: int
    block_table: list[int]
    num_computed: int


@dataclass
class SimRunner:
    """What the model runner knows, rebuilt from scheduler outputs only."""

    states: dict[str, RunnerState] = field(default_factory=dict)
    kv: dict[int, list[int | None]] = field(default_factory=dict)
    # The fake model: (request id, output index) -> the token it samples.
    token_fn: Callable[[str, int], int] = model_token

    def execute(self, so: SchedulerOutput, scheduler: Scheduler) -> ModelRunnerOutput:
        for req_id in so.finished_req_ids | so.preempted_req_ids:
            self.states.pop(req_id, None)
        for new in so.scheduled_new_reqs:
            self.states[new.req_id] = RunnerState(
                tokens=list(new.prompt_token_ids) + list(new.output_token_ids),
                num_prompt_tokens=len(new.prompt_token_ids),
                block_table=list(new.block_ids),
                num_computed=new.num_computed_tokens,
            )
        cached = so.scheduled_cached_reqs
        for req_id, new_blocks, num_computed in zip(
            cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=True
        ):
            state = self.states[req_id]
            assert num_computed == state.num_computed, "runner and scheduler disagree"
            if new_blocks is not None:
                assert new_blocks, "no new block is None, not []"
                state.block_table.extend(new_blocks)

        kv_manager = scheduler.kv_cache_manager
        req_ids = list(so.num_scheduled_tokens)
        # Every row writes its KV first, then attends (per layer, as on the device).
        for req_id in req_ids:
            state = self.states[req_id]
            n = so.num_scheduled_tokens[req_id]
            start = state.num_computed
            assert state.block_table == kv_manager.get_block_ids(req_id)
            assert 0 not in state.block_table, "the null block is never handed out"
            assert start + n <= len(state.tokens), "an input token the runner does not know"
            assert len(state.block_table) * BLOCK_SIZE >= start + n
            for pos in range(start, start + n):
                block = self.kv.setdefault(state.block_table[pos // BLOCK_SIZE], [None] * 4)
                block[pos % BLOCK_SIZE] = state.tokens[pos]
        sampled: list[list[int]] = []
        for req_id in req_ids:
            state = self.states[req_id]
            end = state.num_computed + so.num_scheduled_tokens[req_id]
            for pos in range(end):
                stored = self.kv[state.block_table[pos // BLOCK_SIZE]][pos % BLOCK_SIZE]
                assert stored == state.tokens[pos], f"{req_id} reads a wrong KV slot at {pos}"
            state.num_computed = end
            if end == len(state.tokens):
                token = self.token_fn(req_id, len(state.tokens) - state.num_prompt_tokens)
                state.tokens.append(token)
                sampled.append([token])
            else:
                sampled.append([])
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )


def check_step(scheduler: Scheduler, so: SchedulerOutput, forced_reset: bool) -> None:
    cfg = scheduler.scheduler_config
    counts = so.num_scheduled_tokens
    assert all(n > 0 for n in counts.values())
    assert so.total_num_scheduled_tokens == sum(counts.values())
    assert so.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
    assert len(counts) <= cfg.max_num_seqs
    assert len(scheduler.running) <= cfg.max_num_seqs
    new_ids = [r.req_id for r in so.scheduled_new_reqs]
    cached_ids = so.scheduled_cached_reqs.req_ids
    assert sorted(new_ids + cached_ids) == sorted(counts)
    if so.preempted_req_ids and not forced_reset:
        assert not new_ids, "a waiting request was admitted in a step that preempted"
    for req_id in counts:
        request = scheduler.requests[req_id]
        assert request.status == RequestStatus.RUNNING
        # num_computed_tokens already includes this step; input positions < max_model_len - 1.
        assert request.num_computed_tokens <= MAX_MODEL_LEN - 1
    if not cfg.enable_chunked_prefill:
        for new in so.scheduled_new_reqs:
            num_known = len(new.prompt_token_ids) + len(new.output_token_ids)
            assert new.num_computed_tokens + counts[new.req_id] == num_known
    check_blocks(scheduler)


def check_blocks(scheduler: Scheduler) -> None:
    kv = scheduler.kv_cache_manager
    pool = kv.block_pool
    holders = Counter(b.block_id for blocks in kv.req_to_blocks.values() for b in blocks)
    for block in pool.blocks[1:]:
        assert block.ref_cnt == holders.get(block.block_id, 0)
        if block.ref_cnt > 1:
            assert block.block_hash is not None, "only cached full blocks are shared"
    free = pool.free_block_queue.get_all_free_blocks()
    assert len(free) == pool.get_num_free_blocks()
    assert all(b.ref_cnt == 0 for b in free)
    assert len(free) + len(holders) == pool.num_blocks - 1
    for req_id, blocks in kv.req_to_blocks.items():
        assert len(set(map(id, blocks))) == len(blocks), f"{req_id} holds a block twice"


def run_simulation(
    policy: str,
    async_scheduling: bool,
    seed: int,
    num_steps: int,
    enable_chunked_prefill: bool = True,
    defer_prefix_caching: bool = False,
    flush_probability: float = 1.0,
    long_prefill_token_threshold: int = 0,
) -> list[tuple]:
    """Run the workload; return its transcript: what every step scheduled (new requests with
    their blocks and hits, running requests with their new blocks, preemptions)."""
    rng = random.Random(seed)
    flush_rng = random.Random(seed + 1)  # apart, so the workload is the same either way
    transcript: list[tuple] = []
    scheduler = create_scheduler(
        max_num_seqs=6,
        # Without chunked prefill the budget must hold a whole max_model_len prompt.
        max_num_batched_tokens=32 if enable_chunked_prefill else MAX_MODEL_LEN,
        enable_chunked_prefill=enable_chunked_prefill,
        max_model_len=MAX_MODEL_LEN,
        num_blocks=24,
        block_size=BLOCK_SIZE,
        async_scheduling=async_scheduling,
        policy=policy,
        defer_prefix_caching=defer_prefix_caching,
        long_prefill_token_threshold=long_prefill_token_threshold,
    )
    depth = 2 if async_scheduling else 1
    hasher = make_block_hasher(BLOCK_SIZE)
    prefixes = [[rng.randrange(1, VOCAB) for _ in range(12)] for _ in range(3)]
    runner = SimRunner()
    in_flight: deque[tuple[SchedulerOutput, ModelRunnerOutput]] = deque()
    all_requests: dict[str, Request] = {}
    received: dict[str, list[int]] = {}
    finished: dict[str, tuple[FinishReason, int | str | None]] = {}
    aborted: set[str] = set()
    next_id = 0
    clock = 0.0
    forced_reset = False

    for step in range(num_steps * 4):
        arriving = step < num_steps
        if not arriving and not in_flight and not scheduler.has_requests():
            break
        if arriving and rng.random() < 0.35:
            for _ in range(rng.choice((1, 1, 2))):
                prompt = list(rng.choice(prefixes)[: rng.randrange(0, 13)])
                prompt += [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 30))]
                max_tokens = rng.randrange(1, 30)
                params = SamplingParams(
                    max_tokens=max_tokens,
                    min_tokens=min(rng.choice((0, 0, 0, 3)), max_tokens),
                    ignore_eos=rng.random() < 0.1,
                    stop_token_ids=[STOP_ID] if rng.random() < 0.3 else None,
                )
                clock += rng.choice((0.0, 0.5, 1.0))  # equal arrival times happen
                req = Request(
                    f"r{next_id}",
                    prompt,
                    params,
                    eos_token_id=EOS,
                    arrival_time=clock,
                    priority=rng.randrange(4) if policy == "priority" else 0,
                    block_hasher=hasher,
                )
                next_id += 1
                all_requests[req.request_id] = req
                received[req.request_id] = []
                scheduler.add_request(req)
        if scheduler.requests and rng.random() < 0.04:
            victim = rng.choice(sorted(scheduler.requests))
            scheduler.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
            aborted.add(victim)
        if rng.random() < 0.005:
            assert scheduler.reset_prefix_cache(reset_running_requests=True)
            forced_reset = True

        # EngineCore.step / step_with_batch_queue.
        if scheduler.has_requests():
            so = scheduler.schedule()
            check_step(scheduler, so, forced_reset)
            forced_reset = False
            in_flight.append((so, runner.execute(so, scheduler)))
            transcript.append(summarize(so))
            if defer_prefix_caching and flush_rng.random() < flush_probability:
                scheduler.flush_deferred_caching()  # EngineCore, once the step launched
            if so.total_num_scheduled_tokens > 0 and len(in_flight) < depth:
                continue
        elif not in_flight:
            continue
        so, out = in_flight.popleft()
        eco = scheduler.update_from_output(so, out)
        for o in eco.outputs:
            assert o.request_id not in finished and o.request_id not in aborted
            received[o.request_id].extend(o.new_token_ids)
            if o.finish_reason is not None:
                finished[o.request_id] = (o.finish_reason, o.stop_reason)
        check_blocks(scheduler)
    else:
        pytest.fail("the simulation did not drain")

    assert len(all_requests) > 100
    assert scheduler.num_preemptions > 0
    assert len(aborted) > 5
    for req_id, req in all_requests.items():
        tokens, reason, stop_reason = expected_output(req)
        if req_id in aborted:
            assert tokens[: len(received[req_id])] == received[req_id]
            assert req.status == RequestStatus.FINISHED_ABORTED or req_id in finished
        else:
            assert received[req_id] == tokens, req_id
            assert finished[req_id] == (reason, stop_reason), req_id
            assert req.output_token_ids == tokens
    assert_scheduler_empty(scheduler)
    stats = scheduler.make_stats()
    assert stats.prefix_cache_hits > 0
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage) == (0, 0, 0.0)
    return transcript


def summarize(so: SchedulerOutput) -> tuple:
    new = tuple((r.req_id, tuple(r.block_ids), r.num_computed_tokens)
                for r in so.scheduled_new_reqs)
    cached = so.scheduled_cached_reqs
    running = tuple(zip(cached.req_ids, map(tuple, (b or () for b in cached.new_block_ids)),
                        cached.num_computed_tokens, strict=True))
    return (new, running, tuple(sorted(so.num_scheduled_tokens.items())),
            tuple(sorted(so.preempted_req_ids)))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_random_workload(policy: str, async_scheduling: bool):
    run_simulation(policy, async_scheduling, seed=1234, num_steps=1500)


@pytest.mark.parametrize("defer", [False, True], ids=["now", "deferred"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_random_workload_with_long_prefill_chunks(async_scheduling: bool, defer: bool):
    """Capped chunks let a running prefill allocate (and register) blocks in a step before a
    later request's allocation preempts it under the priority policy: what it registered that
    step is never filled, and no later request may read it."""
    for seed in (1, 2, 3):
        run_simulation("priority", async_scheduling, seed=seed, num_steps=600,
                       long_prefill_token_threshold=5, defer_prefix_caching=defer)


def test_random_workload_without_chunked_prefill():
    run_simulation("fcfs", True, seed=99, num_steps=1500, enable_chunked_prefill=False)


@pytest.mark.parametrize("flush_probability", [1.0, 0.5, 0.0], ids=["flush", "some", "none"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_deferred_caching_schedules_the_same(async_scheduling: bool, flush_probability: float):
    """Deferred prefix caching (the engine's) against registering at allocation: the same
    steps, the same blocks, the same hits, whenever (or whether) the engine flushes."""
    policy = "priority" if async_scheduling else "fcfs"
    immediate = run_simulation(policy, async_scheduling, seed=4321, num_steps=800)
    deferred = run_simulation(policy, async_scheduling, seed=4321, num_steps=800,
                              defer_prefix_caching=True, flush_probability=flush_probability)
    assert len(deferred) == len(immediate)
    for step, (a, b) in enumerate(zip(immediate, deferred, strict=True)):
        assert a == b, f"step {step} differs"


def _run_identical_groups(policy: str, async_scheduling: bool, seed: int, defer: bool,
                          flush_probability: float = 1.0, num_steps: int = 300) -> list[tuple]:
    """Requests in three groups of identical prompts whose fake model samples the same tokens
    (greedy n > 1, or one prompt sent twice): their filled blocks have equal hashes, and which
    of two such blocks a later lookup finds depends on the order they were registered in."""
    rng = random.Random(seed)
    flush_rng = random.Random(seed + 1)
    scheduler = create_scheduler(max_num_seqs=6, max_num_batched_tokens=32,
                                 max_model_len=MAX_MODEL_LEN, num_blocks=24,
                                 block_size=BLOCK_SIZE, async_scheduling=async_scheduling,
                                 policy=policy, defer_prefix_caching=defer)
    group: dict[str, int] = {}

    def token_fn(req_id: str, index: int) -> int:
        return 1 + zlib.crc32(f"{group[req_id]}:{index}".encode()) % (VOCAB - 1)

    runner = SimRunner(token_fn=token_fn)
    hasher = make_block_hasher(BLOCK_SIZE)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(5, 20))] for _ in range(3)]
    depth = 2 if async_scheduling else 1
    in_flight: deque[tuple[SchedulerOutput, ModelRunnerOutput]] = deque()
    transcript: list[tuple] = []
    next_id = 0
    for step in range(num_steps * 4):
        arriving = step < num_steps
        if not arriving and not in_flight and not scheduler.has_requests():
            break
        if arriving and rng.random() < 0.35:
            g = rng.randrange(3)
            for _ in range(rng.choice((1, 2, 3))):
                req_id = f"r{next_id}"
                next_id += 1
                group[req_id] = g
                scheduler.add_request(Request(
                    req_id, prompts[g],
                    SamplingParams(max_tokens=rng.randrange(5, 30), ignore_eos=True),
                    eos_token_id=EOS, arrival_time=float(step),
                    priority=rng.randrange(3) if policy == "priority" else 0,
                    block_hasher=hasher))
        if scheduler.requests and rng.random() < 0.03:
            scheduler.finish_requests(rng.choice(sorted(scheduler.requests)),
                                      RequestStatus.FINISHED_ABORTED)
        if scheduler.has_requests():
            so = scheduler.schedule()
            in_flight.append((so, runner.execute(so, scheduler)))
            transcript.append(summarize(so))
            if defer and flush_rng.random() < flush_probability:
                scheduler.flush_deferred_caching()
            if so.total_num_scheduled_tokens > 0 and len(in_flight) < depth:
                continue
        elif not in_flight:
            continue
        so, out = in_flight.popleft()
        scheduler.update_from_output(so, out)
        check_blocks(scheduler)
    else:
        pytest.fail("the simulation did not drain")
    assert_scheduler_empty(scheduler)
    return transcript


@pytest.mark.parametrize("flush_probability", [1.0, 0.5, 0.0], ids=["flush", "some", "none"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_deferred_caching_keeps_the_order_of_equal_blocks(policy: str, async_scheduling: bool,
                                                          flush_probability: float):
    """Identical requests fill blocks of equal hashes: deferred registration must replay the
    registrations in the order immediate registration made them (a preemption's free among
    them included), or a lookup takes another block and the block tables, free counts and
    later preemptions drift apart."""
    for seed in range(12):
        immediate = _run_identical_groups(policy, async_scheduling, seed, defer=False)
        deferred = _run_identical_groups(policy, async_scheduling, seed, defer=True,
                                         flush_probability=flush_probability)
        assert len(deferred) == len(immediate), seed
        for step, (a, b) in enumerate(zip(immediate, deferred, strict=True)):
            assert a == b, f"seed {seed}: step {step} differs"
