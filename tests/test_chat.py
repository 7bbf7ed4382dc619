"""cadence.chat's conversations as the offline LLM.chat hands them to a template: content
parts read as text as the server reads them (vLLM)."""

from __future__ import annotations

import pytest

from cadence.chat import content_parts, conversation_of, developer_as_system


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


def test_plain_strings_are_text_and_null_texts_are_skipped() -> None:
    # vLLM's reading: a string in a content list is a text part; a text-like part whose text
    # is null or missing is left out (not an empty line).
    messages = [{"role": "user", "content": ["a", {"type": "text", "text": None}, "b",
                                             {"type": "text"}, {"type": "refusal"},
                                             {"type": "refusal", "text": "not a refusal's key"}]},
                {"role": "user", "content": [{"type": "text", "text": None}]}]
    assert [m["content"] for m in conversation_of(messages)] == ["a\nb", ""]
    openai = conversation_of(messages, "openai")
    assert openai[0]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert openai[1]["content"] == []
    assert content_parts(["x", {"type": "output_text", "text": None}]) == [
        {"type": "text", "text": "x"}]


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
    {"type": "text", "text": 3},
    {"type": "refusal", "refusal": ["x"]},
    {"text": "no type"},
    5,
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
    # An empty list of calls is none (vLLM drops it on both paths, as the server's messages):
    # Llama-3.1's template would otherwise render "No tool calls found." for the content.
    assert conversation_of([{"role": "assistant", "content": "ok", "tool_calls": []}]) == [
        {"role": "assistant", "content": "ok"}]


def test_developer_messages_become_one_front_system_message_unless_the_template_names_them(
        ) -> None:
    sys_a, dev_b = {"role": "system", "content": "A"}, {"role": "developer", "content": "B",
                                                        "tools": [{"x": 1}], "name": "n"}
    user = {"role": "user", "content": "u"}
    plain = "{% for m in messages %}{{ m.content }}{% endfor %}"
    # Named (either quote, or in one of a tokenizer's named templates): unchanged.
    for template in ("{% if m.role == 'developer' %}", '{{ "developer" }}',
                     {"default": plain, "tool_use": "{% if r == 'developer' %}"}):
        assert developer_as_system([sys_a, user, dev_b], template) == [sys_a, user, dev_b]
    # Not named (or the ChatML fallback, None): system, without its tools; merged at the
    # front with the others, the texts a blank line apart, empty ones left out.
    for template in (plain, None, {"default": plain}):
        assert developer_as_system([sys_a, user, dev_b], template) == [
            {"role": "system", "content": "A\n\nB"}, user]
    assert developer_as_system([dev_b, user], plain) == [
        {"role": "system", "content": "B", "name": "n"}, user]  # first and only: as it is
    assert developer_as_system([user, dev_b], plain) == [{"role": "system", "content": "B"},
                                                         user]
    empty = {"role": "system", "content": ""}
    assert developer_as_system([empty, user, dev_b], plain) == [
        {"role": "system", "content": "B"}, user]
    # Content as parts ("openai" format) stays parts.
    parts = [{**m, "content": content_parts(m["content"])} for m in (sys_a, user, dev_b)]
    assert developer_as_system(parts, plain) == [
        {"role": "system", "content": content_parts("A\nB".replace("\n", "\n\n"))},
        parts[1]]
    assert developer_as_system([sys_a, user], plain) == [sys_a, user]  # no developer: as it is


def test_named_templates_take_the_content_format_of_the_one_that_renders() -> None:
    """A tokenizer with several named templates (Command-R's, Hermes'): the one transformers
    picks (tool_use with tools, else default) sets the content format, and the rendering with
    text parts equals transformers' own."""
    from transformers import AutoTokenizer

    from cadence.chat import content_format
    from cadence.model.tiny import ensure_tiny_model
    from cadence.server.chat_template import render_chat
    from cadence.server.protocol_chat import ChatMessage

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    parts = "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %};{% endfor %}"
    text = "{% for m in messages %}{{ m.content }};{% endfor %}"
    tok.chat_template = {"default": parts, "tool_use": text}
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert content_format("auto", tok, None) == "openai"
    assert content_format("auto", tok, None, tools) == "string"
    assert content_format("auto", tok, "tool_use") == "string"
    content = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
    messages = [{"role": "user", "content": content}]
    want = tok.encode(tok.apply_chat_template(messages, tokenize=False),
                      add_special_tokens=False)
    assert tok.decode(want) == "Helloworld;"
    assert render_chat(tok, [ChatMessage.model_validate(m) for m in messages]) == want


def test_a_tool_messages_content_stays_text_in_the_openai_format() -> None:
    """Templates read a tool result as a string: under the "openai" content format the other
    messages' content becomes text parts, a tool message's stays text (its parts joined)."""
    messages = [{"role": "user", "content": "hi"},
                {"role": "tool", "content": "42", "tool_call_id": "c1"},
                {"role": "tool", "content": [{"type": "text", "text": "a"}, "b"],
                 "tool_call_id": "c2"}]
    out = conversation_of(messages, "openai")
    assert [m["content"] for m in out] == [[{"type": "text", "text": "hi"}], "42", "a\nb"]
    assert out[1]["tool_call_id"] == "c1"


def test_a_merged_system_messages_parts_keep_their_line_breaks() -> None:
    """Merging a developer message into a system message given as several text parts: the
    parts' texts are joined by a newline (as everywhere parts become text), the messages' by a
    blank line."""
    system = {"role": "system", "content": [{"type": "text", "text": "Be brief."},
                                            {"type": "text", "text": "Use French."}]}
    conversation = [system, {"role": "developer", "content": "No emojis."},
                    {"role": "user", "content": "hi"}]
    merged = developer_as_system(conversation, "{{ messages }}")
    assert merged == [{"role": "system", "content": [
        {"type": "text", "text": "Be brief.\nUse French.\n\nNo emojis."}]},
        {"role": "user", "content": "hi"}]
