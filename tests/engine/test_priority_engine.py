"""Priority scheduling end to end: high-priority requests finish first under contention, and
every request gets the same greedy tokens as under fcfs."""

from __future__ import annotations

import pytest

from cadence import LLM, RequestOutputKind, SamplingParams

PROMPTS = ["alpha beta", "gamma", "delta epsilon zeta", "eta theta", "iota", "kappa lambda mu"]
PRIORITIES = [5, 3, 4, 0, 2, 1]


def _run(policy: str, async_scheduling: bool, priorities: list[int] | None):
    llm = LLM("tiny", device="cpu", max_num_seqs=2, scheduling_policy=policy,
              async_scheduling=async_scheduling)
    core = llm.engine_core
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        prio = priorities[i] if priorities else 0
        req, _ = llm.frontend.input_processor.process(str(i), prompt, params, priority=prio)
        core.add_request(req)
    finished_at: dict[int, int] = {}
    tokens: dict[int, list[int]] = {}
    step = 0
    while core.has_work():
        outs, _ = core.step_fn()
        step += 1
        for o in outs.outputs if outs else []:
            tokens.setdefault(int(o.request_id), []).extend(o.new_token_ids)
            if o.finished:
                finished_at[int(o.request_id)] = step
    return finished_at, tokens


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_priority_finishes_high_priority_first_with_fcfs_tokens(async_scheduling):
    finished_at, tokens = _run("priority", async_scheduling, PRIORITIES)
    _, fcfs_tokens = _run("fcfs", async_scheduling, None)
    assert tokens == fcfs_tokens
    assert all(len(t) == 8 for t in tokens.values())
    # Two sequence slots: requests finish in pairs, lowest priority values first.
    by_priority = sorted(range(len(PROMPTS)), key=lambda i: PRIORITIES[i])
    steps = [finished_at[i] for i in by_priority]
    assert steps == sorted(steps)
    assert steps[0] == steps[1] < steps[2] == steps[3] < steps[4] == steps[5]


def test_fcfs_finishes_in_arrival_order():
    finished_at, _ = _run("fcfs", False, None)
    steps = [finished_at[i] for i in range(len(PROMPTS))]
    assert steps == sorted(steps)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_fcfs_takes_priorities_and_keeps_arrival_order(async_scheduling):
    # vLLM v1 (its test_generate.py's priority cases run under the default fcfs policy): a
    # priority is accepted and plays no part; same order, same tokens as without one.
    finished_at, tokens = _run("fcfs", async_scheduling, PRIORITIES)
    plain_at, plain_tokens = _run("fcfs", async_scheduling, None)
    assert finished_at == plain_at and tokens == plain_tokens


def test_llm_generate_takes_priorities_under_fcfs():
    llm = LLM("tiny", device="cpu", max_num_seqs=2)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    plain = llm.generate(PROMPTS, params, use_tqdm=False)
    one = llm.generate(PROMPTS[0], params, use_tqdm=False, priority=[7])
    many = llm.generate(PROMPTS, params, use_tqdm=False, priority=PRIORITIES)
    assert [o.outputs[0].token_ids for o in many] == [o.outputs[0].token_ids for o in plain]
    assert one[0].outputs[0].token_ids == plain[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="priority"):  # one per prompt, or one for all
        llm.generate(PROMPTS[:2], params, use_tqdm=False, priority=[1, 2, 3])


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_children_that_outgrow_the_cache_do_not_preempt_each_other_forever(async_scheduling):
    """An n = 2 request whose children cannot both fit: under the priority policy the children
    tie on (priority, arrival time); the victim follows the waiting queue's order (request id
    last), so the first child always runs on. Broken by the running list's order instead, the
    two preempted each other for ever (each re-prefilling 8 tokens a step, then preempted)."""
    from cadence.engine.llm_engine import LLMEngine
    from tests.tiny import tiny_args

    engine = LLMEngine(tiny_args(device="cpu", max_model_len=256, scheduling_policy="priority",
                                 num_gpu_blocks_override=18, max_num_batched_tokens=512,
                                 long_prefill_token_threshold=8,
                                 enable_prefix_caching=False, async_scheduling=async_scheduling))
    try:
        prompt = {"prompt_token_ids": [(7 * i) % 500 + 3 for i in range(40)]}
        # 40 + 149 tokens need 12 of the 17 usable blocks: one child fits, two do not.
        engine.add_request("r", prompt, SamplingParams(
            max_tokens=150, temperature=1.0, seed=1, n=2, ignore_eos=True,
            output_kind=RequestOutputKind.FINAL_ONLY))
        final = None
        # Far more steps than two children run one after the other take (~2 x 160).
        for _ in range(2000):
            if not engine.has_unfinished_requests():
                break
            final = next((o for o in engine.step() if o.finished), final)
        assert not engine.has_unfinished_requests(), "the children never finished"
        assert final is not None
        assert [len(c.token_ids) for c in final.outputs] == [150, 150]
    finally:
        engine.shutdown()
