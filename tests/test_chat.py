"""cadence.chat's conversations as the offline LLM.chat hands them to a template: content
parts read as text as the server reads them (vLLM)."""

from __future__ import annotations

import pytest

from cadence.chat import conversation_of


def test_text_like_parts_are_joined_text() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"},
                                     {"type": "input_text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"},
                                          {"type": "output_text", "text": "c"}]},
        {"role": "assistant", "content": None, "name": "kept"},
    ]
    out = conversation_of(messages)
    assert [m["content"] for m in out] == ["a\nb", "no\nc", ""]
    assert out[2]["name"] == "kept" and out[0]["role"] == "user"


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
    {"type": "refusal", "text": "the refusal's text is under 'refusal'"},
    {"type": "text", "text": 3},
    {"type": "refusal", "refusal": None},
    "text",
])
def test_other_parts_are_refused_naming_the_message(part) -> None:
    messages = [{"role": "user", "content": "ok"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, part]}]
    with pytest.raises(ValueError, match=r"^messages\.1\.content: only text parts"):
        conversation_of(messages)


def test_keys_set_to_none_are_left_out() -> None:
    # A template's "is defined" test must not see a null field (older transformers releases
    # rendered it as "None"); a null content is empty text, as before.
    messages = [{"role": "assistant", "content": None, "reasoning": None, "name": None,
                 "tool_calls": None},
                {"role": "user", "content": "hi", "name": "ann"}]
    assert conversation_of(messages) == [{"role": "assistant", "content": ""},
                                         {"role": "user", "content": "hi", "name": "ann"}]
