"""Every bad input is a ValueError naming the parameter, raised before anything is scheduled;
the engine keeps serving afterwards and holds no KV blocks for the rejected requests."""

from __future__ import annotations

import pytest

from cadence import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_model_len=128, num_gpu_blocks_override=8, max_num_seqs=4,
               device="cpu")


GOOD = SamplingParams(temperature=0.0, max_tokens=4)


@pytest.mark.parametrize(
    ("prompt", "params", "needle"),
    [
        ("", GOOD, "prompt"),
        ({"prompt_token_ids": []}, GOOD, "prompt"),
        ({"prompt_token_ids": [1, 2, 100000]}, GOOD, "100000"),
        ({"prompt_token_ids": [1, -3]}, GOOD, "prompt_token_ids"),
        # Capped at the context (128), which the KV cache (7 usable blocks, 112 tokens) misses.
        ("hello " * 10, SamplingParams(max_tokens=127), "KV cache"),
        ({"prompt_token_ids": [5] * 128}, GOOD, "maximum context length"),
        # Fits the context (100 + 20 <= 128) but not the whole KV cache (7 usable blocks).
        ({"prompt_token_ids": [5] * 100}, SamplingParams(max_tokens=20), "KV cache"),
    ],
)
def test_bad_prompts_raise_before_scheduling(llm, prompt, params, needle):
    free = llm.engine_core.num_free_kv_blocks
    # A good prompt in the same call must not be scheduled either.
    with pytest.raises(ValueError, match=needle):
        llm.generate(["fine", prompt], params, use_tqdm=False)
    assert llm.engine_core.scheduler.get_num_unfinished_requests() == 0
    assert llm.engine_core.num_free_kv_blocks == free
    out = llm.generate(["still serving"], GOOD, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(seed=1 << 63), "seed"),
        (dict(seed=-(1 << 63) - 1), "seed"),
        (dict(stop_token_ids=[1 << 63]), "stop_token_ids"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_tokens=5, max_tokens=2), "min_tokens"),
    ],
)
def test_bad_sampling_params(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("priority", [[True], ["1"], [1 << 63], [1, 2]])
def test_bad_priorities(llm, priority):
    with pytest.raises(ValueError, match="priority"):
        llm.generate(["a"], GOOD, priority=priority, use_tqdm=False)


def test_bad_models(tmp_path):
    with pytest.raises(ValueError, match="model"):
        LLM(str(tmp_path / "missing"))
    (tmp_path / "config.json").write_text(
        '{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}')
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        LLM(str(tmp_path))
    with pytest.raises(ValueError, match="load_format"):
        LLM("qwen3-0.6b")  # a shape preset has no weights: only load_format="dummy"
    with pytest.raises(ValueError, match="scheduling_policy"):
        LLM("tiny", scheduling_policy="lifo")


def test_shutdown_is_idempotent():
    llm = LLM("tiny", device="cpu", max_num_seqs=2)
    out = llm.generate(["x"], GOOD, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    llm.shutdown()
    llm.shutdown()
    for call in (lambda: llm.generate(["x"], GOOD, use_tqdm=False),
                 lambda: llm.chat([{"role": "user", "content": "x"}], GOOD, use_tqdm=False)):
        with pytest.raises(RuntimeError, match="has been shut down"):
            call()


def test_numpy_integers_are_python_ints_to_the_engine(llm):
    # A numpy seed passed the checks as an Integral, then overflowed where the sampler mixes it
    # into 64-bit arithmetic: the step failed (and an AsyncLLM's engine died).
    np = pytest.importorskip("numpy")
    params = SamplingParams(temperature=1.0, max_tokens=5, seed=np.int64(5), n=np.int32(2),
                            top_k=np.int64(20), logprobs=np.int16(1))
    assert {type(v) for v in (params.seed, params.n, params.top_k, params.logprobs)} == {int}
    late = SamplingParams(temperature=1.0, max_tokens=5, top_k=20, logprobs=1)
    late.seed = np.uint64(5)  # set after construction: normalised at submission
    plain = SamplingParams(temperature=1.0, max_tokens=5, seed=5, n=2, top_k=20, logprobs=1)
    want = [c.token_ids for c in llm.generate("Hello", plain, use_tqdm=False)[0].outputs]
    assert [c.token_ids for c in llm.generate("Hello", params, use_tqdm=False)[0].outputs] == want
    got = llm.generate("Hello", late, use_tqdm=False)[0].outputs[0].token_ids
    assert got == want[0]
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=np.uint64(1 << 63))  # past int64: refused, not wrapped


@pytest.mark.parametrize(("field", "value"), [("temperature", -1.0), ("n", 0),
                                              ("max_tokens", 0), ("top_p", float("nan")),
                                              ("skip_special_tokens", "no")])
def test_a_field_set_after_construction_is_checked_at_submission(llm, field, value):
    """SamplingParams is a plain dataclass: a field set later gets the constructor's check when
    the request is submitted (and the caller's object stays as it was)."""
    params = SamplingParams(temperature=0.0, max_tokens=4)
    setattr(params, field, value)
    with pytest.raises(ValueError, match=field):
        llm.generate(["fine", "also fine"], params, use_tqdm=False)
    assert getattr(params, field) is value
    assert not llm.output_processor.has_unfinished_requests()
    assert llm.engine_core.scheduler.get_num_unfinished_requests() == 0


def test_a_request_failing_as_it_is_added_leaves_none_of_its_batch(llm, monkeypatch):
    """If adding the second request of a call fails, the first is taken back too: the next
    call runs only its own requests."""
    free = llm.engine_core.num_free_kv_blocks
    add = llm.output_processor.add_request
    calls = []

    def failing_second(req, text):
        calls.append(req.request_id)
        if len(calls) == 2:
            raise RuntimeError("planted failure")
        return add(req, text)

    monkeypatch.setattr(llm.output_processor, "add_request", failing_second)
    with pytest.raises(RuntimeError, match="planted"):
        llm.generate(["one", "two"], GOOD, use_tqdm=False)
    monkeypatch.undo()
    assert not llm.output_processor.has_unfinished_requests()
    assert llm.engine_core.scheduler.get_num_unfinished_requests() == 0
    assert llm.engine_core.num_free_kv_blocks == free
    out = llm.generate(["still serving"], GOOD, use_tqdm=False)
    assert len(out) == 1 and len(out[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("params", [{"temperature": 0}, "greedy", 3])
def test_sampling_params_of_the_wrong_kind_say_so(llm, params):
    # A dict of one key read as a list of one SamplingParams ("got str") before.
    with pytest.raises(ValueError, match=r"sampling_params: a SamplingParams or a list of "
                                         rf"them .*got {type(params).__name__}"):
        llm.generate(["hi"], params, use_tqdm=False)


def test_max_tokens_past_the_context_ends_at_the_context() -> None:
    """vLLM's offline engine checks the prompt alone and ends a request at max_model_len with
    "length"; it does not refuse a max_tokens that runs past it (its OpenAI server does)."""
    llm = LLM("tiny", max_model_len=64, num_gpu_blocks_override=32, device="cpu")
    try:
        prompts = [{"prompt_token_ids": [5 + i] * 40} for i in range(2)]
        capped = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1_000,
                                                      ignore_eos=True), use_tqdm=False)
        exact = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24,
                                                     ignore_eos=True), use_tqdm=False)
        for a, b in zip(capped, exact, strict=True):
            assert len(a.outputs[0].token_ids) == 64 - 40
            assert a.outputs[0].finish_reason == "length"
            assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert llm.engine_core.num_free_kv_blocks == 31  # all but the null block
    finally:
        llm.shutdown()


def test_lists_of_token_ids_are_prompts(llm):
    """vLLM's prompt forms: a flat list of ints is one token prompt, a list of such lists one
    prompt each; both give the tokens of the same ids as a prompt_token_ids dict."""
    ids = [[72, 101, 108], [108, 111, 32, 119]]
    expected = [o.outputs[0].token_ids for o in llm.generate(
        [{"prompt_token_ids": i} for i in ids], GOOD, use_tqdm=False)]
    (one,) = llm.generate(ids[0], GOOD, use_tqdm=False)
    assert one.prompt_token_ids == ids[0] and one.outputs[0].token_ids == expected[0]
    both = llm.generate(ids, GOOD, use_tqdm=False)
    assert [o.prompt_token_ids for o in both] == ids
    assert [o.outputs[0].token_ids for o in both] == expected
    for bad in ([72, "x"], [[72, True]], [[]], [72, 1 << 40]):
        with pytest.raises(ValueError, match="prompt"):
            llm.generate(bad, GOOD, use_tqdm=False)
    assert llm.engine_core.scheduler.get_num_unfinished_requests() == 0


def test_seed_minus_one_is_no_fixed_seed(llm):
    """vLLM: seed=-1 means unseeded. Two 12-token samples at temperature 1 from a 640-token
    vocabulary agree by chance with probability far below 1e-20; a fixed seed repeats."""
    free = SamplingParams(temperature=1.0, max_tokens=12, seed=-1, ignore_eos=True)
    runs = [llm.generate("Hello", free, use_tqdm=False)[0].outputs[0].token_ids
            for _ in range(2)]
    assert runs[0] != runs[1]
    fixed = SamplingParams(temperature=1.0, max_tokens=12, seed=5, ignore_eos=True)
    again = [llm.generate("Hello", fixed, use_tqdm=False)[0].outputs[0].token_ids
             for _ in range(2)]
    assert again[0] == again[1]


def test_vllm_calling_conventions_run() -> None:
    """What code written for vLLM passes: a tqdm factory as use_tqdm (called for the bar),
    vLLM's engine arguments that change nothing here, and AsyncLLM's data_parallel_rank 0."""
    import asyncio

    from cadence.engine.async_llm import AsyncLLM
    from cadence.engine.engine_args import EngineArgs

    made: list[dict] = []

    def factory(**kwargs):
        from tqdm.auto import tqdm

        made.append(kwargs)
        return tqdm(disable=True, **kwargs)

    llm = LLM("tiny", disable_log_stats=False, swap_space=4, tokenizer_mode="auto")
    try:
        outs = llm.generate(["a", "b"], SamplingParams(max_tokens=2), use_tqdm=factory)
        assert len(outs) == 2 and made and made[0]["total"] == 2

        def broken(**kwargs):
            raise TypeError("not a progress bar")

        with pytest.raises(TypeError, match="not a progress bar"):
            llm.generate(["a", "b"], SamplingParams(max_tokens=50), use_tqdm=broken)
        assert not llm.output_processor.has_unfinished_requests()  # nothing left behind
        assert not llm.engine_core.scheduler.has_unfinished_requests()
    finally:
        llm.shutdown()
    with pytest.raises(ValueError, match="tokenizer_mode"):
        EngineArgs(tokenizer_mode="mistral")

    async def run() -> None:
        engine = AsyncLLM.from_engine_args(EngineArgs(model="tiny"))
        try:
            params = SamplingParams(max_tokens=2)
            outs = [o async for o in engine.generate("hi", params, "r0", data_parallel_rank=0)]
            assert outs[-1].finished
            with pytest.raises(ValueError, match="data_parallel_rank"):
                async for _ in engine.generate("hi", params, "r1", data_parallel_rank=1):
                    pass
        finally:
            engine.shutdown()

    asyncio.run(run())
