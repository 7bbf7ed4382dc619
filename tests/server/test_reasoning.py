"""--reasoning-parser: <think> ... </think> goes to the message's reasoning field, whole or
streamed (tags split across pieces are held back, never shown half)."""

from __future__ import annotations

import random

import openai
import pytest

from cadence.server.reasoning import REASONING_PARSERS, reasoning_parser
from tests.server.waiting import wait_released

Q, D = REASONING_PARSERS["qwen3"], REASONING_PARSERS["deepseek_r1"]

CASES = [  # text, (reasoning, content) for both parsers (current vLLM's: the output is
    # reasoning up to </think>, an opening <think> it starts with dropped; all of it without)
    ("<think>plan it</think>\n\nThe answer.", ("plan it", "\n\nThe answer.")),
    ("  <think>still thinking", ("still thinking", None)),
    ("Just an answer.", ("Just an answer.", None)),
    # Qwen3.5's templates open <think> in the prompt: the output only closes it.
    ("thought</think>answer", ("thought", "answer")),
    ("<think></think>x", (None, "x")),
    ("a < b </thin", ("a < b </thin", None)),
    ("", (None, "")),  # an empty answer is "", as without a parser
    ("<th", ("<th", None)),  # a tag's start that the output ends on stays
    ("  <think", ("  <think", None)),
    ("<think>why</th", ("why</th", None)),
]


@pytest.mark.parametrize(("text", "want"), CASES)
def test_whole_outputs(text, want) -> None:
    assert Q.split(text) == want
    assert D.split(text) == want
    # The prompt ended the reasoning (or thinking is off): all of it is content.
    assert Q.split(text, reasoning_ended=True) == (None, text)
    assert D.split(text, reasoning_ended=True) == (None, text)


@pytest.mark.parametrize("parser", [Q, D], ids=["qwen3", "deepseek_r1"])
@pytest.mark.parametrize("seed", range(20))
def test_any_chunking_streams_the_same_parts(parser, seed) -> None:
    rng = random.Random(seed)
    for text, *_ in CASES:
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text), rng.randrange(0, 6))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        stream = parser.stream()
        reasoning, content = "", ""
        for i, piece in enumerate(pieces):
            r, c = stream.feed(piece, final=i == len(pieces) - 1)
            reasoning, content = reasoning + r, content + c
        want = parser.split(text)
        assert (reasoning or None, content or None) == (want[0], want[1] or None), pieces


def test_a_tag_split_across_pieces_is_held_back() -> None:
    s = D.stream()
    assert s.feed("abc</th") == ("abc", "")
    assert s.feed("ink>def") == ("", "def")
    s = Q.stream()
    assert s.feed(" <thi") == ("", "")
    assert s.feed("nk>x") == ("x", "")


def test_unknown_parser_names_the_choices() -> None:
    with pytest.raises(ValueError, match="deepseek_r1, qwen3"):
        reasoning_parser("nope")


def test_only_an_explicit_false_switch_turns_thinking_off() -> None:
    """Qwen3's enable_thinking turns thinking off only when it is False (as its template
    tests it): a null or missing switch leaves thinking on, and deepseek_r1 has no switch."""
    assert Q.thinking_off({"enable_thinking": False})
    for kwargs in ({"enable_thinking": None}, {"enable_thinking": True}, {}, None):
        assert not Q.thinking_off(kwargs), kwargs
    assert not D.thinking_off({"enable_thinking": False})


def _streamed_parts(client: openai.OpenAI, kw: dict) -> dict[str, str]:
    """The reasoning and content a streamed chat answer's deltas add up to."""
    streamed = {"reasoning": "", "content": ""}
    for chunk in client.chat.completions.create(**kw, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None:
            streamed["reasoning"] += getattr(delta, "reasoning", None) or ""
            streamed["content"] += delta.content or ""
    return streamed


THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


@pytest.mark.parametrize("template", [THINKING_TEMPLATE, None], ids=["opens-think", "no-tags"])
@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
def test_reasoning_through_the_openai_client(server_factory, name, template) -> None:
    """Without a closing tag the answer is reasoning, whether the prompt opened <think> or
    holds neither tag (vLLM's: only a prompt whose last tag closes it makes content)."""
    srv = server_factory(app_kwargs={"reasoning_parser": name, "chat_template": template})
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "why?"}], max_tokens=12,
              temperature=0.0, extra_body={"ignore_eos": True, "return_token_ids": True})
    out = client.chat.completions.create(**kw)
    msg = out.choices[0].message
    text = srv.engine.tokenizer.decode(out.choices[0].token_ids)
    # The random model never closes it: all of it is reasoning.
    want = REASONING_PARSERS[name].split(text)
    assert want == (text, None)
    assert (getattr(msg, "reasoning", None), msg.content) == want
    streamed = _streamed_parts(client, kw)
    assert (streamed["reasoning"] or None, streamed["content"] or None) == want


THINKING_OFF_TEMPLATE = THINKING_TEMPLATE.replace("<think>\n", "<think>\n\n</think>\n\n")


@pytest.mark.parametrize(("name", "template", "kwargs", "include"), [
    ("deepseek_r1", THINKING_OFF_TEMPLATE, None, True),
    ("qwen3", THINKING_OFF_TEMPLATE, None, True),
    ("qwen3", THINKING_TEMPLATE, {"enable_thinking": False}, True),
    ("qwen3", THINKING_OFF_TEMPLATE, None, False)],
    ids=["prompt-closed-deepseek", "prompt-closed-qwen3", "qwen3-thinking-off",
         "prompt-closed-include-reasoning-false"])
def test_an_answer_after_a_closed_reasoning_is_all_content(server_factory, name, template,
                                                           kwargs, include) -> None:
    """vLLM's prompt_is_reasoning_end: a prompt whose last tag closes the reasoning (a template
    that turned thinking off), or qwen3 with enable_thinking false, makes the answer content
    (include_reasoning false changes nothing there: there is no reasoning to leave out)."""
    srv = server_factory(app_kwargs={"reasoning_parser": name, "chat_template": template})
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "why?"}], max_tokens=12,
              temperature=0.0, extra_body={"ignore_eos": True, "return_token_ids": True,
                                           "chat_template_kwargs": kwargs,
                                           "include_reasoning": include})
    out = client.chat.completions.create(**kw)
    if include:
        text = srv.engine.tokenizer.decode(out.choices[0].token_ids)
    else:  # the ids are left out under include_reasoning false: the same answer's, shown
        text = srv.engine.tokenizer.decode(client.chat.completions.create(**{
            **kw, "extra_body": {**kw["extra_body"], "include_reasoning": True}}
        ).choices[0].token_ids)
    msg = out.choices[0].message
    assert (getattr(msg, "reasoning", None), msg.content) == (None, text)
    streamed = _streamed_parts(client, kw)
    assert streamed == {"reasoning": "", "content": text}


@pytest.mark.parametrize("stream", [False, True])
def test_include_reasoning_false_leaves_the_reasoning_out(server_factory, stream) -> None:
    """vLLM's include_reasoning false: the output is still split at its end tag, the reasoning
    is left out (content is the answer after it), and so are the logprobs and token ids that
    would show it; the same request with reasoning shows all three."""
    from tests.server.tool_call_helpers import scripted_server

    srv, n = scripted_server(server_factory, "secret plan</think>The answer.",
                             reasoning_parser="qwen3", chat_template=THINKING_TEMPLATE)
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "q"}], max_tokens=n,
              logprobs=True, top_logprobs=2,
              extra_body={"ignore_eos": True, "return_token_ids": True})
    for include, want in ((True, ("secret plan", "The answer.")), (False, (None, "The answer."))):
        body = {**kw, "extra_body": {**kw["extra_body"], "include_reasoning": include}}
        if not stream:
            choice = client.chat.completions.create(**body).choices[0]
            msg = choice.message
            assert (getattr(msg, "reasoning", None), msg.content) == want
            ids, lps = getattr(choice, "token_ids", None), choice.logprobs
            # Each per-token field shows the reasoning only where it is shown.
            assert (ids is not None) == include and (lps is not None) == include
            continue
        parts = {"reasoning": "", "content": ""}
        ids, lps, chunks = [], 0, 0
        for chunk in client.chat.completions.create(**body, stream=True):
            if not chunk.choices:
                continue
            chunks += 1
            delta = chunk.choices[0].delta
            parts["reasoning"] += getattr(delta, "reasoning", None) or ""
            parts["content"] += delta.content or ""
            ids += getattr(chunk.choices[0], "token_ids", None) or []
            lps += len(chunk.choices[0].logprobs.content) if chunk.choices[0].logprobs else 0
        assert (parts["reasoning"] or None, parts["content"]) == want
        assert (ids != [], lps == n) == (include, include)
    wait_released(srv.engine)


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1"])
def test_an_empty_answer_is_empty_content_streamed_or_not(server_factory, name) -> None:
    """The model ends at once (its end token forced): content is "" as without a parser, in the
    whole message and in the stream alike, and there is no reasoning."""
    srv = server_factory(app_kwargs={"reasoning_parser": name})
    eos = srv.engine.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
              temperature=0.0, logit_bias={str(eos): 100})
    out = client.chat.completions.create(**kw)
    msg = out.choices[0].message
    assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == 1
    assert msg.content == "" and getattr(msg, "reasoning", None) is None
    content, reasoning = [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None:
            content.append(delta.content)
            reasoning.append(getattr(delta, "reasoning", None))
    assert "".join(c for c in content if c) == "" and not any(reasoning)


def test_each_streamed_choice_splits_its_own_reasoning(server_factory) -> None:
    """n = 2 with an answer scripted to close the reasoning: each choice has a splitter of its
    own (a shared one, past the first choice's </think>, would show the second's reasoning as
    content)."""
    from transformers import AutoTokenizer

    from cadence.model.tiny import ensure_tiny_model
    from tests.server.test_tool_calls import ScriptedCore

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    ScriptedCore.SCRIPT = tok.encode("plan it</think>the answer", add_special_tokens=False)
    srv = server_factory(core_factory=ScriptedCore, app_kwargs={
        "reasoning_parser": "deepseek_r1", "chat_template": THINKING_TEMPLATE})
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    streamed = {i: {"reasoning": "", "content": ""} for i in (0, 1)}
    for chunk in client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "why?"}], n=2, stream=True,
            max_tokens=len(ScriptedCore.SCRIPT), extra_body={"ignore_eos": True}):
        for choice in chunk.choices:
            streamed[choice.index]["reasoning"] += getattr(choice.delta, "reasoning", None) or ""
            streamed[choice.index]["content"] += choice.delta.content or ""
    want = {"reasoning": "plan it", "content": "the answer"}
    assert streamed == {0: want, 1: want}


@pytest.mark.parametrize("script", ['{"city": "Paris"}', "plan it</think>{\"city\": \"Paris\"}"])
def test_a_forced_tool_call_is_all_content_where_the_tags_are_split(server_factory,
                                                                    script) -> None:
    """The tiny tokenizer splits ``<think>`` into several tokens, so no grammar can wait for
    the reasoning's end: it applies from the first token, and the whole output is the answer
    (vLLM refuses such a tokenizer under a reasoning parser). A forced tool choice's call
    carries all of it, no reasoning, streamed or not; once this lost the call to "reasoning"."""
    from transformers import AutoTokenizer

    from cadence.model.tiny import ensure_tiny_model
    from tests.server.test_tool_calls import TOOLS, ScriptedCore

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    ScriptedCore.SCRIPT = tok.encode(script, add_special_tokens=False)
    srv = server_factory(core_factory=ScriptedCore, app_kwargs={
        "reasoning_parser": "deepseek_r1", "chat_template": THINKING_TEMPLATE})
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
              tool_choice={"type": "function", "function": {"name": "get_weather"}},
              max_tokens=len(ScriptedCore.SCRIPT), extra_body={"ignore_eos": True})
    msg = client.chat.completions.create(**kw).choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
    assert (getattr(msg, "reasoning", None), calls) == (None, [("get_weather", script)])
    assert msg.content == ""  # vLLM: "" beside forced calls
    streamed, streamed_calls, texts = "", [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            streamed += getattr(choice.delta, "reasoning", None) or ""
            texts.append(choice.delta.content or "")
            streamed_calls += [(c.function.name, c.function.arguments)
                               for c in choice.delta.tool_calls or []]
    assert (streamed, streamed_calls, "".join(texts)) == ("", [("get_weather", script)], "")
    # A JSON answer likewise: content, not reasoning.
    ScriptedCore.SCRIPT = tok.encode("{}", add_special_tokens=False)
    msg = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "json"}], max_tokens=2,
        response_format={"type": "json_object"}, extra_body={"ignore_eos": True},
    ).choices[0].message
    assert (getattr(msg, "reasoning", None), msg.content) == (None, "{}")


def test_the_reasoning_tags_reach_the_grammar_where_they_are_single_tokens() -> None:
    """The chat endpoint hands the engine the parser's tags as token ids (the grammar then
    applies after the reasoning, as vLLM's does) when the tokenizer has each as one token;
    otherwise none, and the grammar applies from the first token."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from cadence.model.tiny import ensure_tiny_model
    from cadence.server.serving_chat import OpenAIServingChat

    def serving(tokenizer, parser):
        engine = SimpleNamespace(tokenizer=tokenizer, model_name="tiny")
        chat = OpenAIServingChat(engine, "tiny")
        chat.reasoning = parser
        return chat

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    assert serving(tok, D).reasoning_tags is None  # "<think>" is several tokens here
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    tags = serving(tok, D).reasoning_tags
    assert tags == tuple(tok.convert_tokens_to_ids(["<think>", "</think>"]))
    assert serving(tok, None).reasoning_tags is None
    # The prompt's last tag, by id, says whether the answer starts after the reasoning.
    start, end = tags
    request = SimpleNamespace(chat_template_kwargs=None, include_reasoning=True,
                              template_kwargs=lambda: None)
    for prompt, ended in (([5, start, 6], False), ([5, start, 6, end, 7], True),
                          ([end, 5, start], False), ([5, 6], False)):
        assert serving(tok, D).reasoning_ended(request, prompt) is ended, prompt
    off = SimpleNamespace(chat_template_kwargs={"enable_thinking": False},
                          include_reasoning=True,
                          template_kwargs=lambda: {"enable_thinking": False})
    assert serving(tok, Q).reasoning_ended(off, [5, start]) is True
    assert serving(tok, D).reasoning_ended(off, [5, start]) is False  # no such switch
