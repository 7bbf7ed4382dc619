"""The output carriers: vLLM's fields for features this engine lacks are present and empty, so
that code written against vLLM's ``RequestOutput`` reads them without an AttributeError."""

from __future__ import annotations

import dataclasses

import pytest

from cadence.outputs import CompletionOutput, RequestOutput


def test_vllm_fields_for_absent_features_are_empty() -> None:
    out = RequestOutput("r", "hi", [1, 2], None, [CompletionOutput(0, "x", [3])], finished=True)
    assert out.lora_request is None and out.outputs[0].lora_request is None
    assert out.encoder_prompt is None and out.encoder_prompt_token_ids is None
    assert out.kv_transfer_params is None and out.multi_modal_placeholders == {}
    # Each output has its own (vLLM's plain dict): changing one changes no other.
    other = RequestOutput("s", "hi", [1], None, [], finished=True)
    out.multi_modal_placeholders["image"] = []
    assert other.multi_modal_placeholders == {}
    # A copy keeps them; they stay out of the repr.
    assert dataclasses.replace(out).lora_request is None
    assert "lora_request" not in repr(out) and "kv_transfer" not in repr(out)


def test_positional_arguments_mean_what_they_mean_in_vllm() -> None:
    """vLLM's order: RequestOutput(request_id, prompt, prompt_token_ids, prompt_logprobs,
    outputs, finished, metrics, lora_request, encoder_prompt, encoder_prompt_token_ids,
    num_cached_tokens); CompletionOutput(index, text, token_ids, cumulative_logprob, logprobs,
    routed_experts, finish_reason, stop_reason, ...)."""
    c = CompletionOutput(0, "x", [1], -0.5, None, None, "stop", 7)
    assert (c.cumulative_logprob, c.finish_reason, c.stop_reason) == (-0.5, "stop", 7)
    assert c.routed_experts is None and c.kv_transfer_params is None
    prompt_logprobs = [None, {1: None}]
    r = RequestOutput("id", "p", [1, 2], prompt_logprobs, [c], True, None, None, None, None, 16)
    assert r.prompt_logprobs is prompt_logprobs and r.outputs == [c] and r.finished is True
    assert r.metrics is None and r.num_cached_tokens == 16
    with pytest.raises(TypeError):  # prompt_logprobs, outputs and finished are required
        RequestOutput("id", "p", [1], [c], True)  # type: ignore[call-arg]


def test_the_engine_fills_them_empty() -> None:
    from cadence import LLM, SamplingParams

    llm = LLM("tiny", max_model_len=64, num_gpu_blocks_override=8, device="cpu")
    try:
        (out,) = llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False)
    finally:
        llm.shutdown()
    assert out.lora_request is None and out.outputs[0].lora_request is None
    assert out.encoder_prompt is None and out.multi_modal_placeholders == {}
    # Outputs travel (multiprocessing, Ray, files) and copy as vLLM's do.
    import copy
    import pickle

    assert pickle.loads(pickle.dumps(out)) == out
    assert copy.deepcopy(out) == out
    assert dataclasses.asdict(out)["outputs"][0]["token_ids"] == list(out.outputs[0].token_ids)


def test_metrics_answer_to_vllms_names() -> None:
    """vLLM v1's RequestStateStats names (0.0 until set) and v0's time_in_queue read the
    same timestamps."""
    from cadence.outputs import RequestMetrics

    m = RequestMetrics(arrival_time=10.0)
    assert (m.queued_ts, m.scheduled_ts, m.first_token_ts, m.last_token_ts,
            m.first_token_latency, m.time_in_queue) == (0.0, 0.0, 0.0, 0.0, 0.0, None)
    m.queued_time, m.first_scheduled_time = 10.5, 11.0
    m.first_token_time, m.last_token_time = 12.0, 13.0
    assert (m.queued_ts, m.scheduled_ts, m.first_token_ts, m.last_token_ts) == (
        10.5, 11.0, 12.0, 13.0)
    assert (m.first_token_latency, m.time_in_queue) == (2.0, 1.0)


def test_flat_logprobs_read_as_the_list_of_dicts_they_replace() -> None:
    from cadence.outputs import FlatLogprobs, Logprob

    rows = [None, {7: Logprob(-0.5, 2, "a"), 3: Logprob(-0.1, 1, "b")},
            {9: Logprob(-2.0, 5, None)}, {}]
    flat = FlatLogprobs()
    flat.extend(rows)
    assert len(flat) == 4
    assert list(flat) == [{} if r is None else r for r in rows]
    assert flat[1] == rows[1] and list(flat[1]) == [7, 3]  # the entries' order kept
    assert flat[-2] == rows[2] and flat[-1] == {}
    part = flat[1:3]
    assert isinstance(part, FlatLogprobs) and list(part) == rows[1:3]
    assert part.token_ids == [7, 3, 9] and part.start_indices == [0, 2]
    assert flat[:] == flat and flat[:] is not flat
    assert list(flat[::2]) == [{}, rows[2]]
    import pytest

    with pytest.raises(IndexError):
        flat[4]
    for change in (lambda: flat.__setitem__(0, {}), lambda: flat.__delitem__(0),
                   lambda: flat.insert(0, {})):
        with pytest.raises(TypeError):
            change()
    assert len(flat) == 4


def test_request_output_takes_arguments_of_a_newer_vllm(caplog) -> None:
    # vLLM's tests/test_outputs.py: an argument a newer version added is taken and ignored.
    with caplog.at_level("WARNING", logger="cadence.outputs"):
        out = RequestOutput(request_id="r", prompt="p", prompt_token_ids=[1, 2, 3],
                            prompt_logprobs=None, outputs=[], finished=False,
                            example_arg_added_in_new_version="some_value")
    assert (out.request_id, out.prompt_token_ids, out.finished) == ("r", [1, 2, 3], False)
    assert not hasattr(out, "example_arg_added_in_new_version")
    assert "example_arg_added_in_new_version" in caplog.text
    with pytest.raises(TypeError):  # a missing field is still an error
        RequestOutput(request_id="r", prompt="p")


def test_adding_a_later_delta_keeps_the_prompt_logprobs_and_takes_its_stop_reason() -> None:
    """vLLM's RequestOutput.add (aggregate): text appended, ids extended; the prompt logprobs
    arrive with the first output only and stay; the later finish and stop reasons win."""
    first = RequestOutput("r", "p", [1, 2], [None, {2: None}],
                          [CompletionOutput(0, "a", [3])], False)
    later = RequestOutput("r", "p", [1, 2], [],
                          [CompletionOutput(0, "b", [4], finish_reason="stop", stop_reason="END")],
                          True)
    first.add(later, aggregate=True)
    (merged,) = first.outputs
    assert (merged.text, list(merged.token_ids)) == ("ab", [3, 4])
    assert (merged.finish_reason, merged.stop_reason) == ("stop", "END")
    assert first.prompt_logprobs == [None, {2: None}] and first.finished
