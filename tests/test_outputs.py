"""The output carriers: vLLM's fields for features this engine lacks are present and empty, so
that code written against vLLM's ``RequestOutput`` reads them without an AttributeError."""

from __future__ import annotations

import dataclasses

import pytest

from cadence.outputs import CompletionOutput, RequestOutput


def test_vllm_fields_for_absent_features_are_empty() -> None:
    out = RequestOutput("r", "hi", [1, 2], [CompletionOutput(0, "x", [3])], finished=True)
    assert out.lora_request is None and out.outputs[0].lora_request is None
    assert out.encoder_prompt is None and out.encoder_prompt_token_ids is None
    assert out.kv_transfer_params is None and out.multi_modal_placeholders == {}
    # One empty mapping serves every output: read-only, so no output can change another's.
    with pytest.raises(TypeError):
        out.multi_modal_placeholders["image"] = []  # type: ignore[index]
    # A copy keeps them; they stay out of the repr.
    assert dataclasses.replace(out).lora_request is None
    assert "lora_request" not in repr(out) and "kv_transfer" not in repr(out)


def test_the_engine_fills_them_empty() -> None:
    from cadence import LLM, SamplingParams

    llm = LLM("tiny", max_model_len=64, num_gpu_blocks_override=8, device="cpu")
    try:
        (out,) = llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False)
    finally:
        llm.shutdown()
    assert out.lora_request is None and out.outputs[0].lora_request is None
    assert out.encoder_prompt is None and out.multi_modal_placeholders == {}
