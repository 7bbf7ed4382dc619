"""LLM.chat (vLLM's offline chat): conversations rendered through the tokenizer's template (the
built-in model has none: ChatML) or a given one, then generated like prompts."""

from __future__ import annotations

import pytest

from cadence import LLM, SamplingParams
from tests.tiny import tiny_args

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
TEMPLATE = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")


@pytest.fixture(scope="module")
def llm():
    engine = LLM(**vars(tiny_args()))
    yield engine
    engine.shutdown()


def test_one_conversation_is_its_chatml_prompt(llm) -> None:
    conversation = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                 {"type": "text", "text": "there"}]}]
    text = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n"
            "<|im_start|>assistant\n")
    (out,) = llm.chat(conversation, GREEDY, use_tqdm=False)
    (want,) = llm.generate([text], GREEDY, use_tqdm=False)
    assert out.prompt == text
    assert out.prompt_token_ids == want.prompt_token_ids
    assert out.outputs[0].token_ids == want.outputs[0].token_ids


def test_several_conversations_a_given_template_and_continuation(llm) -> None:
    first = [{"role": "user", "content": "a"}]
    second = [{"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]
    outs = llm.chat([first, second], GREEDY, use_tqdm=False, chat_template=TEMPLATE)
    assert [o.prompt for o in outs] == ["[user]a[assistant]", "[user]b[assistant]c[assistant]"]
    (cont,) = llm.chat(second, GREEDY, use_tqdm=False, chat_template=TEMPLATE,
                       add_generation_prompt=False, continue_final_message=True)
    assert cont.prompt == "[user]b[assistant]c"
    (kw,) = llm.chat(first, GREEDY, use_tqdm=False, chat_template="{{ greeting }}",
                     chat_template_kwargs={"greeting": "hello"})
    assert kw.prompt == "hello"


def test_tool_calls_reach_the_template_as_objects(llm) -> None:
    """An assistant's OpenAI-style tool call (arguments as JSON text) is handed to the template
    with its arguments parsed, as the server and vLLM hand it (not JSON text in JSON)."""
    conversation = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    template = ("{% for m in messages %}{{ m.role }}:{{ m.content }}"
                "{% for c in m.tool_calls or [] %}[{{ c.function.name }}"
                "({{ c.function.arguments | tojson }})]{% endfor %};{% endfor %}")
    (out,) = llm.chat(conversation, GREEDY, use_tqdm=False, chat_template=template)
    assert out.prompt == 'user:Weather?;assistant:[get({"city": "Paris"})];tool:sunny;'
    # No arguments ("", None or the key left out: vLLM's; JSON null too) are an empty object.
    for function in ({"name": "get", "arguments": ""}, {"name": "get", "arguments": "null"},
                     {"name": "get", "arguments": None}, {"name": "get"}):
        calls = [{"id": "c1", "type": "function", "function": function}]
        history = [conversation[0], {**conversation[1], "tool_calls": calls}]
        (out,) = llm.chat(history, GREEDY, use_tqdm=False, chat_template=template)
        assert out.prompt == "user:Weather?;assistant:[get({})];", function


@pytest.mark.parametrize(("messages", "kwargs", "fragment"), [
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "",
                                         "tool_calls": [{"id": "x"}]}], {},
     "messages.1.tool_calls.0: a tool call is"),
    ([{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": "{not json"}}]}], {},
     "messages.0.tool_calls.0.function.arguments: must be JSON"),
    ([{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": '{"a": NaN}'}}]}], {},
     "function.arguments: must be JSON"),
    ([{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": "1" + "0" * 5000}}]}], {},
     "function.arguments: hold an integer of more than"),
    ([{"role": "user", "content": "a\ud800b"}], {}, "messages: the text cannot be tokenized"),
    ([], {}, "messages: a conversation"),
    ("hi", {}, "messages: a conversation"),
    ([{"role": None, "content": "x"}], {}, "messages.0.role: a string"),
    ([{"role": "user", "content": 3}], {}, "messages.0.content"),
    ([{"role": "user", "content": "a"}, "b"], {}, "messages.1: a message is a dict"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], {},
     "only text parts"),
    ([{"role": "user", "content": "a"}], {"continue_final_message": True},
     "cannot both be true"),
    ([{"role": "user", "content": "a"}], {"chat_template_kwargs": {"tokenize": True}},
     "cannot set tokenize"),
    ([{"role": "user", "content": "a"}], {"chat_template_kwargs": {"tools": {"a": 1}}},
     r"chat_template_kwargs.tools must be a list of objects \(or null\), got dict"),
    ([{"role": "user", "content": "a"}], {"chat_template_kwargs": {"documents": [{}, None]}},
     r"chat_template_kwargs.documents must be a list of objects \(or null\), got an item of "
     r"type NoneType"),
    ([{"role": "user", "content": "a"}], {"chat_template_kwargs": {"chat_template": 5}},
     r"chat_template_kwargs.chat_template must be a string"),
    ([{"role": "user", "content": "a"}], {"chat_template_kwargs": [1]},
     r"chat_template_kwargs must be a mapping of template variables \(or None\), got list"),

    # JSON's "\ud800" escape in tool-call arguments: a lone surrogate, no text to tokenize.
    ([{"role": "user", "content": "a"},
      {"role": "assistant", "content": None, "tool_calls": [
          {"id": "1", "type": "function",
           "function": {"name": "f", "arguments": '{"a": "\\ud800"}'}}]}],
     {"chat_template": "{% for m in messages %}{% for c in m.tool_calls or [] %}"
                       "{{ c.function.arguments.a }}{% endfor %}{% endfor %}"},
     "messages: the text cannot be tokenized"),
    ([{"role": "user", "content": "a"}], {"chat_template": "{{ raise_exception('no') }}"},
     "messages: chat template rendering failed"),
])
def test_bad_conversations_are_value_errors_naming_the_field(llm, messages, kwargs,
                                                              fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        llm.chat(messages, GREEDY, use_tqdm=False, **kwargs)
    assert llm.engine_core.num_free_kv_blocks == llm.engine_core.num_kv_blocks - 1


def test_chat_hands_priority_and_generate_counts_its_params(llm) -> None:
    conversation = [{"role": "user", "content": "Hi"}]
    # The priority reaches the engine, which checks it (fcfs takes and ignores a valid one).
    (plain,) = llm.chat(conversation, GREEDY, use_tqdm=False)
    (given,) = llm.chat(conversation, GREEDY, use_tqdm=False, priority=[5])
    assert given.outputs[0].token_ids == plain.outputs[0].token_ids
    with pytest.raises(ValueError, match="priority"):
        llm.chat(conversation, GREEDY, use_tqdm=False, priority=[1 << 63])
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(["a", "b"], [GREEDY], use_tqdm=False)  # one short: no prompt dropped
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(["a"], [GREEDY, GREEDY], use_tqdm=False)


def test_vllms_other_arguments_are_taken(llm) -> None:
    """vLLM's lora_request=None and chat_template_content_format are accepted (an adapter, or
    a format vLLM has not, is a clear error); one priority serves every prompt."""
    conversation = [{"role": "user", "content": "Hi"}]
    (a,) = llm.chat(conversation, GREEDY, use_tqdm=False, lora_request=None,
                    chat_template_content_format="string")
    (b,) = llm.chat(conversation, GREEDY, use_tqdm=False)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    with pytest.raises(ValueError, match="lora_request"):
        llm.generate(["a"], GREEDY, use_tqdm=False, lora_request=object())
    with pytest.raises(ValueError, match="chat_template_content_format"):
        llm.chat(conversation, GREEDY, use_tqdm=False, chat_template_content_format="xml")
    outs = llm.generate(["a", "b", "c"], GREEDY, use_tqdm=False, priority=0)
    assert len(outs) == 3
    assert len(llm.generate(["a", "b"], GREEDY, use_tqdm=False, priority=2)) == 2  # for all
    with pytest.raises(ValueError, match="priority"):
        llm.generate(["a"], GREEDY, use_tqdm=False, priority="high")


def test_tools_without_a_chat_template_are_an_error(tmp_path) -> None:
    """The ChatML fallback has no place for tools: refused, naming tools (they were dropped)."""
    import shutil

    from cadence.model.tiny import ensure_tiny_model

    model = tmp_path / "model"
    shutil.copytree(ensure_tiny_model(), model)
    config = model / "tokenizer_config.json"
    import json
    data = json.loads(config.read_text())
    data.pop("chat_template", None)
    config.write_text(json.dumps(data))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    engine = LLM(str(model), device="cpu", max_model_len=128)
    try:
        assert not engine.get_tokenizer().chat_template
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        with pytest.raises(ValueError, match="^tools: this model has no chat template"):
            engine.chat([{"role": "user", "content": "Hi"}], GREEDY, use_tqdm=False,
                        tools=tools)
        (out,) = engine.chat([{"role": "user", "content": "Hi"}], GREEDY, use_tqdm=False)
        assert out.prompt.startswith("<|im_start|>user\nHi")
    finally:
        engine.shutdown()


def test_use_tqdm_shows_a_progress_bar_only_when_asked(llm, capsys) -> None:
    llm.generate(["a", "b"], GREEDY, use_tqdm=False)
    assert "Processed prompts" not in capsys.readouterr().err
    llm.generate(["a", "b"], GREEDY, use_tqdm=True)
    assert "Processed prompts" in capsys.readouterr().err


def test_an_assistants_reasoning_reaches_the_template_under_both_names(llm) -> None:
    template = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}"
                "{% if m.reasoning is defined %}<r {{ m.reasoning }}|"
                "{{ m.reasoning_content }}>{% endif %}{% endfor %}")
    for key in ("reasoning", "reasoning_content"):
        conversation = [{"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "ok", key: "because"}]
        (out,) = llm.chat(conversation, GREEDY, use_tqdm=False, chat_template=template,
                          add_generation_prompt=False)
        assert out.prompt == "[user]Hi[assistant]ok<r because|because>", key
    none = [{"role": "assistant", "content": "ok", "reasoning": None}]
    (out,) = llm.chat(none, GREEDY, use_tqdm=False, chat_template=template,
                      add_generation_prompt=False)
    (bare,) = llm.chat([{"role": "assistant", "content": "ok"}], GREEDY, use_tqdm=False,
                       chat_template=template, add_generation_prompt=False)
    assert out.prompt == bare.prompt == "[assistant]ok"  # a null reasoning is no reasoning
    both = [{"role": "assistant", "content": "ok", "reasoning": None,
             "reasoning_content": "older"}]
    (out,) = llm.chat(both, GREEDY, use_tqdm=False, chat_template=template,
                      add_generation_prompt=False)
    assert out.prompt == "[assistant]ok<r older|older>"
    with pytest.raises(ValueError, match=r"messages\.0\.reasoning"):
        llm.chat([{"role": "assistant", "content": "ok", "reasoning": ["x"]}], GREEDY,
                 use_tqdm=False, chat_template=template)


# A template that loops over each message's content parts (as Llama 4's and Gemma 3's do).
LOOPING = ("{% for m in messages %}<{{ m.role }}>{% if m.content is string %}{{ m.content }}"
           "{% else %}{% for c in m['content'] %}[{{ c['text'] }}]{% endfor %}{% endif %}"
           "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


def test_a_template_that_loops_over_content_gets_its_parts(llm) -> None:
    """vLLM's "auto" content format: a template that iterates over a message's content gets
    OpenAI's text parts (a string is one part), else the parts' text joined; either may be
    asked for by name."""
    conversation = [{"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                 {"type": "text", "text": "there"}]},
                    {"role": "assistant", "content": "ok"}]
    (out,) = llm.chat(conversation, GREEDY, use_tqdm=False, chat_template=LOOPING)
    assert out.prompt == "<user>[Hi][there]<assistant>[ok]<assistant>"
    (out,) = llm.chat(conversation, GREEDY, use_tqdm=False, chat_template=LOOPING,
                      chat_template_content_format="string")
    assert out.prompt == "<user>Hi\nthere<assistant>ok<assistant>"
    # A template that only prints the content takes strings under "auto".
    (out,) = llm.chat(conversation, GREEDY, use_tqdm=False, chat_template=TEMPLATE)
    assert out.prompt == "[user]Hi\nthere[assistant]ok[assistant]"


def test_vllms_positional_chat_and_beam_search_arguments(llm) -> None:
    """vLLM's positional order: chat(messages, sampling_params, use_tqdm, lora_request,
    chat_template, chat_template_content_format, add_generation_prompt, ...) and
    beam_search(prompts, params, lora_request, use_tqdm, concurrency_limit); a list of None
    adapters (one per prompt) is no adapter."""
    from cadence.sampling_params import BeamSearchParams

    conversation = [{"role": "user", "content": "Hi"}]
    (out,) = llm.chat(conversation, GREEDY, False, None, TEMPLATE, "string", False)
    assert out.prompt == "[user]Hi"
    params = BeamSearchParams(beam_width=2, max_tokens=3)
    (a,) = llm.beam_search(["Hello"], params, None, False, 1)
    (b,) = llm.beam_search(["Hello"], params)
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    outs = llm.generate(["a", "b"], GREEDY, use_tqdm=False, lora_request=[None, None])
    assert len(outs) == 2
    with pytest.raises(ValueError, match="mm_processor_kwargs"):
        llm.chat(conversation, GREEDY, use_tqdm=False, mm_processor_kwargs={"x": 1})


@pytest.mark.parametrize("method", ["encode", "embed", "classify", "score", "reward"])
def test_pooling_calls_say_they_are_not_supported(llm, method: str) -> None:
    with pytest.raises(ValueError, match=f"LLM.{method}: pooling"):
        getattr(llm, method)(["a"])


def test_chat_template_kwargs_fill_the_renderers_unset_options(llm) -> None:
    """vLLM's merge of chat_template_kwargs under LLM.chat's named options: a named option wins
    unless unset, so the kwargs' template, tools and documents count where none is given, and
    add_generation_prompt / continue_final_message there change nothing."""
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    template = ("{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
                "{% for d in documents or [] %}<{{ d.title }}>{% endfor %}"
                "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    other = "{% for m in messages %}{{ m.content }}|{% endfor %}"

    def prompt(**kw) -> str:
        (out,) = llm.chat(conversation, GREEDY, use_tqdm=False, **kw)
        return out.prompt

    tool, tool2 = ({"type": "function", "function": {"name": n}} for n in ("f", "g"))
    plain = "user:Hi;assistant:Yo;assistant:"
    assert prompt(chat_template=template) == plain
    for ignored in ({"add_generation_prompt": False}, {"continue_final_message": True}):
        assert prompt(chat_template=template, chat_template_kwargs=ignored) == plain
    assert prompt(chat_template=template, chat_template_kwargs={
        "tools": [tool], "documents": [{"title": "D", "text": "t"}]}) == "[f]<D>" + plain
    assert prompt(chat_template=template, tools=[tool],
                  chat_template_kwargs={"tools": [tool2]}) == "[f]" + plain
    assert prompt(chat_template=template, tools=[tool],
                  chat_template_kwargs={"tools": None}) == "[f]" + plain
    # The kwargs' template where none is named; the named one wins over it.
    assert prompt(chat_template_kwargs={"chat_template": other}) == "Hi|Yo|"
    assert prompt(chat_template=template, chat_template_kwargs={"chat_template": other}) == plain
