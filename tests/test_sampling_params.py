from __future__ import annotations

import pytest

from cadence.sampling_params import RequestOutputKind, SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": "1"}, "temperature"),
        ({"temperature": 2.0000001}, "temperature"),  # OpenAI's and vLLM's [0, 2]
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"logprobs": -2}, "logprobs"),
        ({"prompt_logprobs": -2}, "prompt_logprobs"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": 1e-31}, "repetition_penalty"),
        ({"repetition_penalty": 2e30}, "repetition_penalty"),
        ({"min_p": -0.1}, "min_p"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {1: float("inf")}}, "logit_bias"),
        ({"logit_bias": {1: float("nan")}}, "logit_bias"),
        ({"logit_bias": {1: 1e39}}, "logit_bias"),  # inf in float32
        ({"logit_bias": {1: -3.5e38}}, "logit_bias"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"bad_words": [""]}, "bad_words"),
        ({"logprobs": 1.5}, "logprobs"),
        ({"stop": ["ok", ""]}, "stop"),
        # Fields of the wrong kind name themselves (they failed inside a conversion).
        ({"stop": 5}, "stop"),
        ({"stop_token_ids": 5}, "stop_token_ids"),
        ({"stop_token_ids": "12"}, "stop_token_ids"),
        ({"allowed_token_ids": 5}, "allowed_token_ids"),
        ({"bad_words": 5}, "bad_words"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
        ({"structured_outputs": 5}, "structured_outputs"),
        ({"structured_outputs": "regex"}, "structured_outputs"),
        ({"output_kind": "delta"}, "output_kind"),
        ({"output_kind": 2}, "output_kind"),
        ({"spaces_between_special_tokens": 1}, "spaces_between_special_tokens"),
        ({"stop": ["ok", 3]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"seed": 1.5}, "seed"),
        ({"seed": 1 << 63}, "seed"),
        ({"stop_token_ids": [1 << 64]}, "stop_token_ids"),
        ({"n": 0}, "n"),
        ({"n": 16385}, "n"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"include_stop_str_in_output": None}, "include_stop_str_in_output"),
        ({"detokenize": "yes"}, "detokenize"),
        ({"structured_outputs": {"foo": 1}}, "structured_outputs"),
    ],
)
def test_bad_values_name_the_parameter(kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(ValueError, match=rf"\b{param}\b"):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_defaults_and_normalisation() -> None:
    p = SamplingParams(stop="###", stop_token_ids=[7])
    assert p.stop == ["###"]
    assert p.all_stop_token_ids == {7}
    assert p.output_kind == RequestOutputKind.CUMULATIVE
    assert not p.greedy
    assert SamplingParams(stop=None).stop == []
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]


def test_greedy_resets_top_k_and_top_p() -> None:
    p = SamplingParams(temperature=0.0, top_k=5, top_p=0.3)
    assert p.greedy and p.top_k == 0 and p.top_p == 1.0
    # vLLM: a positive temperature, however small, samples (at 0.01) and keeps its filters.
    tiny = SamplingParams(temperature=1e-7, top_k=5, top_p=0.9, min_p=0.1)
    assert not tiny.greedy and tiny.temperature == 0.01
    assert (tiny.top_k, tiny.top_p, tiny.min_p) == (5, 0.9, 0.1)


def test_greedy_sampling_takes_one_choice() -> None:
    # vLLM's _verify_greedy_sampling: n identical greedy answers are refused.
    with pytest.raises(ValueError, match="n must be 1 when using greedy sampling, got 2"):
        SamplingParams(n=2, temperature=0.0)
    with pytest.raises(ValueError, match="greedy"):
        SamplingParams(n=3, temperature=0)
    assert SamplingParams(n=2, temperature=1e-7).n == 2  # samples at 0.01
    assert SamplingParams(n=1, temperature=0.0).greedy


def test_logprobs_true_reads_as_one() -> None:
    # vLLM's __post_init__: True is 1 (the sampled token's logprob and the top one).
    p = SamplingParams(logprobs=True, prompt_logprobs=True)
    assert (p.logprobs, p.prompt_logprobs) == (1, 1)
    p = SamplingParams(logprobs=False, prompt_logprobs=False)
    assert (p.logprobs, p.prompt_logprobs) == (0, 0)  # vLLM keeps False: "not None", as 0


def test_top_k_zero_is_off_and_tiny_temperatures_are_raised() -> None:
    # vLLM: top_k 0 (the default) disables top-k, -1 is quietly accepted as off and kept;
    # temperatures in (0, 0.01) become 0.01.
    assert SamplingParams().top_k == 0
    assert SamplingParams(top_k=0).top_k == 0
    assert SamplingParams(top_k=-1).top_k == -1
    assert SamplingParams(top_k=1 << 70).top_k == 1 << 70  # the vocabulary bound is the engine's
    assert SamplingParams(temperature=1e-3).temperature == 0.01
    assert SamplingParams(temperature=0.5).temperature == 0.5
    assert SamplingParams(temperature=2).temperature == 2  # the bound itself samples
    assert SamplingParams(seed=-(1 << 63)).seed == -(1 << 63)
    assert SamplingParams(seed=-1).seed is None  # vLLM: -1 is "no fixed seed"
    assert SamplingParams(seed=-2).seed == -2
    assert SamplingParams(seed=(1 << 63) - 1).seed == (1 << 63) - 1


def test_valid_edge_values() -> None:
    # Each value at the edge of its range is accepted and kept as given.
    p = SamplingParams(top_p=1.0, top_k=-1, max_tokens=None, logprobs=0, min_tokens=0)
    assert (p.top_p, p.top_k, p.max_tokens, p.logprobs, p.min_tokens) == (1.0, -1, None, 0, 0)
    assert (p.temperature, p.greedy) == (1.0, False)
    q = SamplingParams(top_k=1, seed=-3, min_tokens=4, max_tokens=4)
    assert (q.top_k, q.seed, q.min_tokens, q.max_tokens) == (1, -3, 4, 4)
    r = SamplingParams(temperature=0.01, top_p=5e-324, stop_token_ids=[0, (1 << 63) - 1])
    assert (r.temperature, r.top_p, r.greedy) == (0.01, 5e-324, False)
    assert r.all_stop_token_ids == {0, (1 << 63) - 1}
    # vLLM's closed penalty range [-2, 2] at its low end; -1 logprobs: all of them.
    s = SamplingParams(presence_penalty=-2.0, frequency_penalty=-2.0, logprobs=-1,
                       prompt_logprobs=-1)
    assert (s.presence_penalty, s.frequency_penalty) == (-2.0, -2.0)
    assert (s.logprobs, s.prompt_logprobs) == (-1, -1)
    # vLLM clamps a positive temperature below 0.01 up to it (not to greedy).
    for tiny in (0.005, 0.009, 1e-6):
        t = SamplingParams(temperature=tiny)
        assert (t.temperature, t.greedy) == (0.01, False)


def test_clone_is_independent() -> None:
    p = SamplingParams(stop=["a"], stop_token_ids=[1])
    q = p.clone()
    q.stop.append("b")  # type: ignore[union-attr]
    q.all_stop_token_ids.add(99)
    assert p.stop == ["a"] and p.all_stop_token_ids == {1}


def test_clone_equals_a_deep_copy_and_shares_no_container() -> None:
    import copy
    from dataclasses import fields

    p = SamplingParams(stop=["a"], stop_token_ids=[1], logit_bias={3: 1.5},
                       allowed_token_ids=[2, 3], bad_words=["x"], extra_args={"k": [1]},
                       structured_outputs={"json": {"type": "object", "properties": {}}})
    p.bad_words_token_ids = [[4, 5]]
    q = p.clone()
    assert q == copy.deepcopy(p)
    for f in fields(SamplingParams):  # a container field added later must be copied too
        value = getattr(p, f.name)
        if isinstance(value, (list, dict, set)) or hasattr(value, "__dataclass_fields__"):
            assert getattr(q, f.name) is not value, f.name
    assert q.bad_words_token_ids[0] is not p.bad_words_token_ids[0]
    assert q.extra_args["k"] is not p.extra_args["k"]
    assert q.structured_outputs.json is not p.structured_outputs.json


def test_skip_clone_makes_clone_shallow() -> None:
    """vLLM's ``skip_clone``: the object is dedicated to one request, its clone shares its
    containers; a bool only; the engine serves such a request as any other."""
    p = SamplingParams(stop=["a"], stop_token_ids=[1], skip_clone=True)
    q = p.clone()
    assert q is not p and q == p and q.stop is p.stop
    assert q.all_stop_token_ids is p.all_stop_token_ids
    with pytest.raises(ValueError, match="skip_clone must be a bool"):
        SamplingParams(skip_clone=1)
    from cadence import LLM

    llm = LLM("tiny", async_scheduling=False)
    try:
        greedy = dict(max_tokens=4, temperature=0.0, ignore_eos=True)
        (a,) = llm.generate("Hello", SamplingParams(**greedy, skip_clone=True), use_tqdm=False)
        (b,) = llm.generate("Hello", SamplingParams(**greedy), use_tqdm=False)
    finally:
        llm.shutdown()
    assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_greedy_also_turns_min_p_off() -> None:
    # vLLM normalises every sampling knob of a greedy request, min_p included.
    p = SamplingParams(temperature=0.0, min_p=0.5)
    assert p.greedy and p.min_p == 0.0 and not p.needs_logits_processing
    assert SamplingParams(temperature=0.7, min_p=0.5).min_p == 0.5


@pytest.mark.parametrize(("kwargs", "penalised"), [
    ({}, False),
    ({"repetition_penalty": 1.2}, True),
    ({"repetition_penalty": 0.8}, True),
    ({"presence_penalty": 0.5}, True),
    ({"frequency_penalty": -0.5}, True),
])
def test_any_penalty_alone_needs_the_token_counts(kwargs: dict[str, float],
                                                  penalised: bool) -> None:
    p = SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert p.has_penalties is penalised
    assert p.needs_logits_processing is penalised


def test_engine_added_stop_ids_survive_a_copy_with_replace() -> None:
    import dataclasses

    p = SamplingParams(stop_token_ids=[7])
    p.all_stop_token_ids |= {2}  # the EOS id, as the engine's input processor adds it
    q = dataclasses.replace(p, max_tokens=5)
    assert q.all_stop_token_ids == {2, 7} and q.stop_token_ids == [7]


def test_whitespace_only_bad_words_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\bbad_words\b"):
        SamplingParams(bad_words=["ok", "  "])
    assert SamplingParams(bad_words=[" ok "]).bad_words == [" ok "]


def test_stop_strings_need_detokenize() -> None:
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(detokenize=False, stop=["###"])
    p = SamplingParams(detokenize=False, stop_token_ids=[3])
    assert p.stop == [] and p.all_stop_token_ids == {3}


def test_list_and_dict_arguments_are_copied() -> None:
    bias = {5: 1.0}
    allowed = [1, 2]
    words = ["bad"]
    p = SamplingParams(logit_bias=bias, allowed_token_ids=allowed, bad_words=words)
    bias[6] = -1.0
    allowed.append(3)
    words.append("worse")
    assert (p.logit_bias, p.allowed_token_ids, p.bad_words) == ({5: 1.0}, [1, 2], ["bad"])


def test_list_fields_take_any_iterable_and_bad_words_a_string() -> None:
    p = SamplingParams(stop=("a", "b"), stop_token_ids=range(3), allowed_token_ids=(5,),
                       bad_words="ab")
    assert (p.stop, p.stop_token_ids, p.allowed_token_ids) == (["a", "b"], [0, 1, 2], [5])
    assert p.bad_words == ["a", "b"]  # vLLM takes a string as its characters
    assert SamplingParams().spaces_between_special_tokens is True


def test_vllm_normalisations_of_lists_flags_and_bounds() -> None:
    # vLLM's __post_init__: repeated stop ids and bad words count once, in first-seen order;
    # bad_words None is []; logprobs=False is 0 (the sampled token's logprob), not None.
    p = SamplingParams(stop_token_ids=[5, 1, 5, 2, 1], bad_words=["a", "b", "a"])
    assert p.stop_token_ids == [5, 1, 2] and p.bad_words == ["a", "b"]
    assert SamplingParams().bad_words == [] and SamplingParams(bad_words=None).bad_words == []
    assert SamplingParams(stop=["x", "x"]).stop == ["x", "x"]  # stop strings are kept as given
    q = SamplingParams(logprobs=False, prompt_logprobs=False)
    assert (q.logprobs, q.prompt_logprobs) == (0, 0)
    # n: vLLM's VLLM_MAX_N_SEQUENCES default bounds it offline; its messages.
    assert SamplingParams(n=200).n == 200 and SamplingParams(n=16384).n == 16384
    with pytest.raises(ValueError, match="n must be at most 16384, got 16385"):
        SamplingParams(n=16385)
    with pytest.raises(ValueError, match="n must be at least 1, got 0"):
        SamplingParams(n=0)
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValueError, match="temperature must be a finite number"):
            SamplingParams(temperature=bad)


def test_stream_interval_and_skip_reading_prefix_cache_are_checked() -> None:
    assert SamplingParams(stream_interval=4).stream_interval == 4
    assert SamplingParams().stream_interval is None
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="stream_interval"):
            SamplingParams(stream_interval=bad)
    with pytest.raises(ValueError, match="skip_reading_prefix_cache"):
        SamplingParams(skip_reading_prefix_cache="yes")
    assert SamplingParams(skip_reading_prefix_cache=False, prompt_logprobs=1
                          ).skip_reading_prefix_cache is False  # as given (vLLM)


def test_positional_arguments_follow_vllms_field_order() -> None:
    # vLLM's SamplingParams begins: n, presence_penalty, frequency_penalty, repetition_penalty,
    # temperature, top_p, top_k, min_p, seed (vllm/sampling_params.py).
    p = SamplingParams(2, 0.5, 0.25, 1.5, 0.7, 0.9, 5, 0.1, 7)
    assert (p.n, p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.temperature,
            p.top_p, p.top_k, p.min_p, p.seed) == (2, 0.5, 0.25, 1.5, 0.7, 0.9, 5, 0.1, 7)


def test_from_optional_takes_nulls_as_defaults() -> None:
    p = SamplingParams.from_optional(n=None, presence_penalty=None, frequency_penalty=None,
                                     repetition_penalty=None, temperature=None, top_p=None,
                                     max_tokens=5, seed=3)
    assert (p.n, p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.temperature,
            p.top_p, p.max_tokens, p.seed) == (1, 0.0, 0.0, 1.0, 1.0, 1.0, 5, 3)
    assert SamplingParams.from_optional(temperature=0.0, n=1).temperature == 0.0
    # Positional, in vLLM's order: n, presence_penalty, frequency_penalty, repetition_penalty,
    # temperature, top_p, top_k, min_p, seed, ...
    p = SamplingParams.from_optional(2, None, 0.5, None, 0.7, None, 4, 0.1, 9)
    assert (p.n, p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.temperature,
            p.top_p, p.top_k, p.min_p, p.seed) == (2, 0.0, 0.5, 1.0, 0.7, 1.0, 4, 0.1, 9)


def test_from_optional_reads_logit_bias_keys_as_text_and_clips_biases() -> None:
    p = SamplingParams.from_optional(logit_bias={"42": 250.0, 7: -1e9, "3": 1.5})
    assert p.logit_bias == {42: 100.0, 7: -100.0, 3: 1.5}
    with pytest.raises(ValueError, match="logit_bias keys"):
        SamplingParams.from_optional(logit_bias={"forty-two": 1.0})
    with pytest.raises(ValueError, match="logit_bias values"):
        SamplingParams.from_optional(logit_bias={"1": "high"})
    with pytest.raises(ValueError, match="logit_bias keys must be token ids"):
        SamplingParams.from_optional(logit_bias={"-3": 1.0})  # converted, then checked
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams.from_optional(temperature=-1.0)  # the constructor's checks still hold


def test_sampling_type_is_vllms() -> None:
    from cadence.sampling_params import SamplingType

    assert SamplingParams(temperature=0.0).sampling_type is SamplingType.GREEDY
    assert SamplingParams(temperature=1e-9).sampling_type is SamplingType.RANDOM  # clamped up
    assert SamplingParams(temperature=0.7).sampling_type is SamplingType.RANDOM
    assert SamplingParams(temperature=0.7, seed=0).sampling_type is SamplingType.RANDOM_SEED
    assert SamplingParams(temperature=0.0, seed=5).sampling_type is SamplingType.GREEDY
    assert [t.value for t in SamplingType] == [0, 1, 2]
