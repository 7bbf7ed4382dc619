"""Chat messages become the prompt the template says: content given as text parts or left out,
the ChatML fallback of a tokenizer without a template, and a template that fails to render.
Expected prompts are written out here and encoded with the tiny tokenizer loaded here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from cadence.model.tiny import ensure_tiny_model

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(ensure_tiny_model()))


@pytest.fixture
def http(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def prompt_ids(http: httpx.Client, messages: list[dict[str, Any]], **kw: Any) -> list[int]:
    """The prompt the server builds, seen by /tokenize and by the chat endpoint's usage."""
    resp = http.post("/tokenize", json={"messages": messages, **kw})
    assert resp.status_code == 200, resp.text
    ids = resp.json()["tokens"]
    chat = http.post(CHAT, json={"messages": messages, "max_tokens": 1, **kw})
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["prompt_tokens"] == len(ids)
    return ids


def encode(hf_tokenizer: Any, text: str) -> list[int]:
    return hf_tokenizer.encode(text, add_special_tokens=False)


def test_content_as_text_parts_or_none(http: httpx.Client, hf_tokenizer: Any) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi "},
                                          {"type": "text", "text": "there"}]}]
    # Text parts are joined by newlines (vLLM).
    expected = "<|im_start|>user\nHi \nthere<|im_end|>\n<|im_start|>assistant\n"
    assert prompt_ids(http, parts) == encode(hf_tokenizer, expected)
    # The same prompt as plain text: the same greedy answer.
    plain = [{"role": "user", "content": "Hi \nthere"}]
    greedy = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}
    answers = [http.post(CHAT, json={"messages": m, **greedy}).json() for m in (parts, plain)]
    assert answers[0]["choices"][0]["message"] == answers[1]["choices"][0]["message"]

    none = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None},
            {"role": "user", "content": []}]
    expected = ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
                "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n")
    assert prompt_ids(http, none) == encode(hf_tokenizer, expected)


def test_refusal_and_responses_text_parts_are_text(http: httpx.Client, hf_tokenizer: Any) -> None:
    # OpenAI clients replay an assistant's refusal as a part; vLLM reads it, and the Responses
    # API's input_text / output_text parts, as text (each was a 400 here).
    messages = [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't"},
                                                  {"type": "output_text", "text": "Sorry"}]},
                {"role": "user", "content": "ok"}]
    expected = ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nI can't\nSorry"
                "<|im_end|>\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n")
    assert prompt_ids(http, messages) == encode(hf_tokenizer, expected)
    # Other part types are still refused, naming the message's content.
    image = [{"role": "user", "content": [{"type": "image_url",
                                            "image_url": {"url": "data:image/png;base64,AA"}}]}]
    resp = http.post(CHAT, json={"messages": image, "max_tokens": 1})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages.0.content"


def test_chat_template_kwargs_fill_the_renderers_unset_options(http: httpx.Client,
                                                               hf_tokenizer: Any) -> None:
    """vLLM's merge of a request's chat_template_kwargs under its named options: the named
    option wins unless unset, so add_generation_prompt / continue_final_message there change
    nothing (/tokenize and the chat endpoint alike); a template there is a request template
    (refused without --trust-request-chat-template); a wrong type where it could count is a
    400 naming chat_template_kwargs."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    plain = prompt_ids(http, messages)
    for ignored in ({"add_generation_prompt": False}, {"continue_final_message": True},
                    {"add_generation_prompt": "yes"}):
        assert prompt_ids(http, messages, chat_template_kwargs=ignored) == plain
    for body, fragment in (({"tools": {"a": 1}}, "must be a list of objects"),
                           ({"chat_template": "{{ 1 }}"}, "--trust-request-chat-template")):
        for path in (CHAT, "/tokenize"):
            resp = http.post(path, json={"messages": messages, "max_tokens": 1,
                                         "chat_template_kwargs": body})
            assert resp.status_code == 400, (path, body, resp.text)
            assert fragment in resp.json()["error"]["message"], resp.text


def test_plain_string_parts_are_text_and_null_parts_are_skipped(
        http: httpx.Client, hf_tokenizer: Any) -> None:
    # vLLM accepts both (each was a 400 here): a string in a content list is a text part; a
    # text or refusal part whose text is null or missing is left out, not an empty line.
    messages = [{"role": "user", "content": ["Hi", {"type": "text", "text": None}, "there",
                                             {"type": "refusal"}]},
                {"role": "assistant", "content": [{"type": "text", "text": None}]},
                {"role": "user", "content": ["ok"]}]
    expected = ("<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
                "<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n")
    assert prompt_ids(http, messages) == encode(hf_tokenizer, expected)


@pytest.fixture(scope="module")
def templated() -> Iterator[Any]:
    """A server of its own: the tests change its tokenizer's chat template."""
    from cadence.engine.async_llm import AsyncLLM
    from tests.server.conftest import start_server, tiny_args

    running = start_server(AsyncLLM(tiny_args()))
    yield running
    running.stop()


def test_chatml_fallback_without_a_template(templated, hf_tokenizer: Any) -> None:
    templated.engine.tokenizer.chat_template = None
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Once upon"}]
    with httpx.Client(base_url=templated.base_url, timeout=30) as http:
        got = prompt_ids(http, messages[:2])
        assert got == encode(hf_tokenizer, "<|im_start|>system\nBe brief.<|im_end|>\n"
                                           "<|im_start|>user\nHi!<|im_end|>\n"
                                           "<|im_start|>assistant\n")
        got = prompt_ids(http, messages[:2], add_generation_prompt=False)
        assert got == encode(hf_tokenizer, "<|im_start|>system\nBe brief.<|im_end|>\n"
                                           "<|im_start|>user\nHi!<|im_end|>\n")
        got = prompt_ids(http, messages, add_generation_prompt=False,
                         continue_final_message=True)
        assert got == encode(hf_tokenizer, "<|im_start|>system\nBe brief.<|im_end|>\n"
                                           "<|im_start|>user\nHi!<|im_end|>\n"
                                           "<|im_start|>assistant\nOnce upon")


def test_any_role_reaches_the_template(templated, hf_tokenizer: Any) -> None:
    """OpenAI still takes a function call's result as role "function"; vLLM passes any other
    role to the template too (Llama 3.1's "ipython"); a role that is not a string is a 400
    naming it."""
    templated.engine.tokenizer.chat_template = None
    messages = [{"role": "user", "content": "Hi!"},
                {"role": "function", "name": "f", "content": "1"},
                {"role": "ipython", "content": "2"}]
    with httpx.Client(base_url=templated.base_url, timeout=30) as http:
        got = prompt_ids(http, messages, add_generation_prompt=False)
        assert got == encode(hf_tokenizer, "<|im_start|>user\nHi!<|im_end|>\n"
                                           "<|im_start|>function\n1<|im_end|>\n"
                                           "<|im_start|>ipython\n2<|im_end|>\n")
        answer = http.post(CHAT, json={"messages": [{"role": "wizard", "content": "x"}],
                                       "max_tokens": 2})
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] >= 1
        bad = http.post(CHAT, json={"messages": [{"role": 7, "content": "x"}]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages.0.role"


def test_tokenize_renders_the_tools_as_the_chat_endpoint_does(templated,
                                                              hf_tokenizer: Any) -> None:
    """vLLM's /tokenize takes the chat request's tools to the template too: its count is the
    chat endpoint's prompt_tokens for the same messages and tools."""
    templated.engine.tokenizer.chat_template = (
        "{% for t in tools or [] %}[tool {{ t.function.name }}]{% endfor %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}")
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    with httpx.Client(base_url=templated.base_url, timeout=30) as http:
        got = prompt_ids(http, [{"role": "user", "content": "hi"}], tools=tools,
                         tool_choice="none")
        assert got == encode(hf_tokenizer, "[tool get_weather]hi")
        bad = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}],
                                           "tools": [{"type": "function"}]})
        assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("tools")


def test_reasoning_effort_reaches_the_template(templated, hf_tokenizer: Any) -> None:
    """OpenAI's reasoning_effort is the template variable ``reasoning_effort`` (vLLM hands it
    over so, over chat_template_kwargs' own), with ``enable_thinking`` false for "none" unless
    chat_template_kwargs set it; a value outside vLLM's list is a 400 naming it."""
    templated.engine.tokenizer.chat_template = (
        "[{{ reasoning_effort if reasoning_effort is defined else 'unset' }}"
        "{{ '' if enable_thinking is not defined else ' on' if enable_thinking else ' off' }}]"
        "{% for m in messages %}{{ m.content }}{% endfor %}")
    hi = [{"role": "user", "content": "hi"}]
    with httpx.Client(base_url=templated.base_url, timeout=30) as http:
        def rendered(**kw: Any) -> list[int]:
            resp = http.post(CHAT, json={"messages": hi, "max_tokens": 1,
                                         "return_token_ids": True, **kw})
            assert resp.status_code == 200, resp.text
            return resp.json()["prompt_token_ids"]

        assert rendered() == encode(hf_tokenizer, "[unset]hi")
        assert rendered(reasoning_effort="low") == encode(hf_tokenizer, "[low on]hi")
        assert rendered(reasoning_effort="none") == encode(hf_tokenizer, "[none off]hi")
        assert rendered(reasoning_effort="high", chat_template_kwargs={
            "reasoning_effort": "medium"}) == encode(hf_tokenizer, "[high on]hi")
        assert rendered(reasoning_effort="none", chat_template_kwargs={
            "enable_thinking": True}) == encode(hf_tokenizer, "[none on]hi")
        bad = http.post(CHAT, json={"messages": hi, "reasoning_effort": "bogus"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"


@pytest.mark.parametrize("template,fragment", [
    ("{{ raise_exception('this template takes no system message') }}", "no system message"),
    ("{% for message in messages %}{{ message['content'] }", "rendering failed"),
    ("{{ messages[0]['content'] + 3 }}", "rendering failed"),
])
def test_a_template_that_fails_is_a_400_naming_messages(templated, template: str,
                                                        fragment: str) -> None:
    templated.engine.tokenizer.chat_template = template
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    with httpx.Client(base_url=templated.base_url, timeout=30) as http:
        for stream in (False, True):
            resp = http.post(CHAT, json={"messages": messages, "stream": stream})
            assert resp.status_code == 400, resp.text
            err = resp.json()["error"]
            assert (err["type"], err["param"]) == ("BadRequestError", "messages")
            assert fragment in err["message"]
        assert http.get("/health").status_code == 200
        ok = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert ok.status_code == 200


TOOL_TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<call {{ c.id }} {{ c.function.name }} "
    "city={{ c.function.arguments.city }} days={{ c.function.arguments.days }}>{% endfor %}"
    "{% if m.tool_call_id %}<answer to {{ m.tool_call_id }} from {{ m.name }}>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)
TOOL_HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
     "content": [{"type": "text", "text": "sunny"}]},
]


def test_tool_calls_and_tool_messages_reach_the_template(hf_tokenizer: Any) -> None:
    """The template reads an assistant's call with its arguments as an object, and a tool
    message's id and name (the shapes Hugging Face templates expect)."""
    from cadence.server.chat_template import render_chat
    from cadence.server.protocol_chat import ChatMessage

    messages = [ChatMessage.model_validate(m) for m in TOOL_HISTORY]
    ids = render_chat(hf_tokenizer, messages, chat_template=TOOL_TEMPLATE)
    expected = ("[user]Weather in Paris?[assistant]<call call_1 get_weather city=Paris days=2>"
                "[tool]sunny<answer to call_1 from get_weather>[assistant]")
    assert ids == encode(hf_tokenizer, expected)


def test_tool_history_in_the_chatml_fallback(hf_tokenizer: Any) -> None:
    """A tokenizer without a template: the calls as the Qwen templates' <tool_call> lines."""
    import copy

    from cadence.server.chat_template import render_chat
    from cadence.server.protocol_chat import ChatMessage

    bare = copy.deepcopy(hf_tokenizer)
    bare.chat_template = None
    messages = [ChatMessage.model_validate(m) for m in TOOL_HISTORY]
    expected = ("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
                "\n</tool_call><|im_end|>\n<|im_start|>tool\nsunny<|im_end|>\n"
                "<|im_start|>assistant\n")
    assert render_chat(bare, messages) == encode(hf_tokenizer, expected)


def test_a_call_without_arguments_reaches_the_template_as_an_empty_object(
        hf_tokenizer: Any) -> None:
    """Arguments "" (a call with none, as agent loops replay it; vLLM's) and JSON null are an
    empty object to the template, not a 400."""
    from cadence.server.chat_template import render_chat
    from cadence.server.protocol_chat import ChatMessage

    template = ("{% for m in messages %}{% for c in m.tool_calls or [] %}"
                "<{{ c.function.name }} {{ c.function.arguments | tojson }}>{% endfor %}"
                "{% endfor %}")
    for arguments in ("", "null", " null ", "{}"):
        history = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]}]
        messages = [ChatMessage.model_validate(m) for m in history]
        ids = render_chat(hf_tokenizer, messages, chat_template=template)
        assert ids == encode(hf_tokenizer, "<f {}>"), arguments


def test_tool_call_arguments_that_are_not_json_are_a_400(http: httpx.Client) -> None:
    bad = [TOOL_HISTORY[0], {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]
    resp = http.post(CHAT, json={"messages": bad, "max_tokens": 1})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "messages.1.tool_calls.0.function.arguments"
    # Arguments that nest past the bound, or that Python's int parser refuses: a 400 naming
    # them (not a recursion error's 500), and the server goes on serving.
    for arguments in ("[" * 1000 + "]" * 1000, "1" * 5000):
        call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}]
        resp = http.post(CHAT, json={"messages": messages, "max_tokens": 1})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "messages.1.tool_calls.0.function.arguments"
    assert http.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}],
                                 "max_tokens": 1}).status_code == 200


def test_tools_reach_the_template(hf_tokenizer: Any) -> None:
    from cadence.server.chat_template import render_chat
    from cadence.server.protocol_chat import ChatMessage

    template = ("{% for t in tools or [] %}[tool {{ t.function.name }}: "
                "{{ t.function.parameters.properties | list | join(',') }}]{% endfor %}"
                "{% for m in messages %}{{ m.content }}{% endfor %}")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {}, "days": {}}}}}]
    ids = render_chat(hf_tokenizer, [ChatMessage(role="user", content="hi")],
                      chat_template=template, tools=tools)
    assert ids == encode(hf_tokenizer, "[tool get_weather: city,days]hi")


def test_a_tools_other_fields_reach_the_template_as_given(server_factory,
                                                          hf_tokenizer: Any) -> None:
    """OpenAI's function.strict (the SDK's pydantic_function_tool always sends it) and other
    fields are the template's to show, as transformers renders the tools given (vLLM keeps
    them); the chat endpoint, /tokenize and the Responses API alike."""
    import openai

    template = ("{{ tools | tojson }}{% for m in messages %}{{ m.content }}{% endfor %}"
                "{% if add_generation_prompt %}>{% endif %}")
    srv = server_factory(app_kwargs={"chat_template": template})
    params = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": params,
                                               "strict": True}, "cache_control": "x"}]
    messages = [{"role": "user", "content": "weather?"}]
    want = encode(hf_tokenizer, hf_tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=template, add_generation_prompt=True,
        tokenize=False))
    assert '"strict": true' in hf_tokenizer.decode(want)
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        assert prompt_ids(http, messages, tools=tools, tool_choice="none") == want
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    flat = [{"type": "function", "name": "get_weather", "parameters": params, "strict": True}]
    out = client.responses.create(model="tiny", input="weather?", tools=flat,
                                  tool_choice="none", max_output_tokens=1)
    nested = [{"type": "function", "function": {"name": "get_weather", "parameters": params,
                                                "strict": True}}]
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        assert out.usage.input_tokens == len(prompt_ids(http, messages, tools=nested,
                                                        tool_choice="none"))


REQUEST_TEMPLATE = ("{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}\n{% endfor %}"
                    "{% if add_generation_prompt %}<<assistant>>{% endif %}")


def test_a_requests_own_template_needs_the_servers_trust(server, server_factory,
                                                         hf_tokenizer) -> None:
    """vLLM's chat_template field: refused (400 naming it) unless the server runs with
    --trust-request-chat-template; then the conversation is rendered with it (the usage counts
    the tokens of that rendering) and a template that does not parse is a 400."""
    messages = [{"role": "user", "content": "Hi there"}]
    body = {"messages": messages, "max_tokens": 2, "chat_template": REQUEST_TEMPLATE}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        refused = http.post("/v1/chat/completions", json=body)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "chat_template"
    trusted = server_factory(app_kwargs={"trust_request_chat_template": True})
    with httpx.Client(base_url=trusted.base_url, timeout=30) as http:
        ok = http.post("/v1/chat/completions", json=body)
        assert ok.status_code == 200, ok.text
        want = hf_tokenizer.encode("<<user>>Hi there\n<<assistant>>", add_special_tokens=False)
        assert ok.json()["usage"]["prompt_tokens"] == len(want)
        broken = http.post("/v1/chat/completions", json={**body, "chat_template": "{% for %}"})
        assert broken.status_code == 400 and broken.json()["error"]["param"] == "chat_template"
        # /tokenize renders with the same template, so its count is what generation uses.
        tokens = http.post("/tokenize", json={"messages": messages,
                                              "chat_template": REQUEST_TEMPLATE})
        assert tokens.status_code == 200 and tokens.json()["tokens"] == want
        # A template named in chat_template_kwargs counts where no other is named (this
        # server has none of its own); the chat_template field wins over it (vLLM's merge).
        kw = {"chat_template_kwargs": {"chat_template": REQUEST_TEMPLATE}}
        ok = http.post("/v1/chat/completions", json={**body, "chat_template": None, **kw})
        assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == len(want)
        tokens = http.post("/tokenize", json={"messages": messages, **kw})
        assert tokens.status_code == 200 and tokens.json()["tokens"] == want
        other = {"chat_template_kwargs": {"chat_template": "{{ 'x' }}"}}
        ok = http.post("/v1/chat/completions", json={**body, **other})
        assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == len(want)
        assert http.get("/health").status_code == 200
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        refused = http.post("/tokenize", json={"messages": messages,
                                               "chat_template": REQUEST_TEMPLATE})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "chat_template"


def test_an_empty_template_in_chat_template_kwargs_names_none() -> None:
    """chat_template_kwargs' chat_template of "" names no template (vLLM's merge skips a falsy
    one): the server's template (or the tokenizer's, None) renders, with no trust needed."""
    from cadence.chat_options import named_template
    from cadence.server.chat_template import request_template

    assert named_template({"chat_template": ""}) is None
    assert named_template({"chat_template": "{{ 'x' }}"}) == "{{ 'x' }}"
    assert request_template(None, "SERVER", False, {"chat_template": ""}) == "SERVER"
    assert request_template(None, None, False, {"chat_template": "", "x": 1}) is None


def test_a_trusting_servers_own_template_wins_over_one_named_in_the_kwargs() -> None:
    """Under --trust-request-chat-template the request's chat_template field wins; else the
    server's --chat-template comes before a template named in chat_template_kwargs, which counts
    only where the server has none."""
    from cadence.server.chat_template import request_template

    named = {"chat_template": "{{ 'named' }}"}
    assert request_template(None, "{{ 'server' }}", True, named) == "{{ 'server' }}"
    assert request_template(None, None, True, named) == "{{ 'named' }}"
    assert request_template("{{ 'own' }}", "{{ 'server' }}", True, named) == "{{ 'own' }}"


REASONING_TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
    "{% if m.reasoning_content is defined %}<rc {{ m.reasoning_content }}>{% endif %}"
    "{% if m.reasoning is defined %}<r {{ m.reasoning }}>{% endif %}{% endfor %}")


def test_an_assistants_reasoning_reaches_the_template(templated, hf_tokenizer: Any) -> None:
    """An assistant's earlier reasoning, sent as ``reasoning`` or as its older name
    ``reasoning_content``, reaches the template under both names (vLLM's interleaved
    thinking); other roles' reasoning does not; a non-string is a 400 naming it."""
    templated.engine.tokenizer.chat_template = REASONING_TEMPLATE
    with httpx.Client(base_url=templated.base_url, timeout=30) as http:
        for key in ("reasoning", "reasoning_content"):
            messages = [{"role": "user", "content": "Hi", key: "ignored"},
                        {"role": "assistant", "content": "ok", key: "I thought"},
                        {"role": "user", "content": "more"}]
            got = prompt_ids(http, messages, add_generation_prompt=False)
            assert got == encode(hf_tokenizer, "[user]Hi[assistant]ok<rc I thought>"
                                               "<r I thought>[user]more"), key
        both = [{"role": "assistant", "content": "ok", "reasoning": "new",
                 "reasoning_content": "old"}]
        got = prompt_ids(http, both, add_generation_prompt=False)
        assert got == encode(hf_tokenizer, "[assistant]ok<rc new><r new>")
        bad = http.post(CHAT, json={"messages": [{"role": "assistant", "content": "ok",
                                                  "reasoning": 3}]})
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "messages.0.reasoning"


def test_documents_reach_the_template(templated, hf_tokenizer: Any) -> None:
    """vLLM's ``documents`` is the template's ``documents`` variable; without a template the
    ChatML fallback cannot show them: a 400 naming documents."""
    templated.engine.tokenizer.chat_template = (
        "{% for d in documents or [] %}<doc {{ d.title }}: {{ d.text }}>{% endfor %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}")
    hi = [{"role": "user", "content": "hi"}]
    docs = [{"title": "a", "text": "one"}, {"title": "b", "text": "two"}]
    with httpx.Client(base_url=templated.base_url, timeout=30) as http:
        chat = http.post(CHAT, json={"messages": hi, "max_tokens": 1, "documents": docs,
                                     "return_token_ids": True})
        assert chat.status_code == 200, chat.text
        assert chat.json()["prompt_token_ids"] == encode(hf_tokenizer,
                                                         "<doc a: one><doc b: two>hi")
        bad = http.post(CHAT, json={"messages": hi, "documents": [{"title": 1}]})
        assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("documents")
        templated.engine.tokenizer.chat_template = None
        none = http.post(CHAT, json={"messages": hi, "documents": docs})
        assert none.status_code == 400 and none.json()["error"]["param"] == "documents"


@pytest.mark.parametrize(("template", "fmt"), [
    ("{% for m in messages %}{{ m.content }}{% endfor %}", "string"),
    ("{% for message in messages %}{% for c in message['content'] %}{{ c.text }}{% endfor %}"
     "{% endfor %}", "openai"),
    ("{% for message in messages %}{% if message['content'] is string %}{{ message.content }}"
     "{% else %}{% for part in message.content | selectattr('type', 'equalto', 'text') %}"
     "{{ part.text }}{% endfor %}{% endif %}{% endfor %}", "openai"),
    ("{% set first = messages[0] %}{% for p in first.content %}{{ p.text }}{% endfor %}",
     "openai"),
    ("{% for m in messages[1:] %}{% for p in m['content'] %}{{ p }}{% endfor %}{% endfor %}",
     "openai"),
    # Through a chain of assignments (Mistral's loop_messages), and a macro's loop over the
    # content it is handed (Qwen3.5's): vLLM reads both as parts.
    ("{% set loop_messages = messages[1:] %}{% set rest = loop_messages %}"
     "{% for message in rest %}{% for part in message['content'] %}{{ part.text }}{% endfor %}"
     "{% endfor %}", "openai"),
    ("{% macro show(content) %}{% for item in content %}{{ item.text }}{% endfor %}"
     "{% endmacro %}{% for m in messages %}{{ show(m.content) }}{% endfor %}", "openai"),
    # A loop over some other object's content is not a message's.
    ("{% for t in tools %}{% for c in t.content %}{{ c }}{% endfor %}{% endfor %}", "string"),
    ("{% for m in messages %}{{ m.content }", "string"),  # does not parse: its error comes later
])
def test_the_content_format_is_read_from_the_template(template: str, fmt: str) -> None:
    from cadence.chat import detect_content_format

    assert detect_content_format(template) == fmt


def test_the_server_hands_content_parts_to_a_template_that_loops_over_them(
        templated, hf_tokenizer: Any) -> None:
    templated.engine.tokenizer.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{% if m.content is string %}{{ m.content }}"
        "{% else %}{% for c in m['content'] %}[{{ c['text'] }}]{% endfor %}{% endif %}"
        "{% endfor %}")
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, "there",
                                             {"type": "text", "text": None}]},
                {"role": "assistant", "content": "ok"},
                {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text",
                                                                      "text": "42"}]}]
    with httpx.Client(base_url=templated.base_url, timeout=30) as http:
        got = prompt_ids(http, messages, add_generation_prompt=False)
    # Each part its own item; a tool's result stays text (templates read it as a string).
    assert got == encode(hf_tokenizer, "<user>[Hi][there]<assistant>[ok]<tool>42")


def test_a_developer_message_is_a_system_one_where_the_template_names_no_such_role(
        templated, hf_tokenizer: Any) -> None:
    """vLLM's: a template that never names "developer" (most drop roles they do not know)
    gets it as a system message, merged with any other system message at the front; one that
    names it gets it as it is. /tokenize renders the same."""
    knows = ("{% for m in messages %}{% if m.role in ['system', 'user', 'assistant'] %}"
             "<{{ m.role }}>{{ m.content }}{% endif %}{% endfor %}")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "developer", "content": "Say BANANA."}]
    with httpx.Client(base_url=templated.base_url, timeout=30) as http:
        templated.engine.tokenizer.chat_template = knows
        got = prompt_ids(http, messages, add_generation_prompt=False)
        assert got == encode(hf_tokenizer, "<system>Be brief.\n\nSay BANANA.<user>Hi")
        tokenized = http.post("/tokenize", json={"messages": messages,
                                                 "add_generation_prompt": False})
        assert tokenized.json()["tokens"] == got
        templated.engine.tokenizer.chat_template = knows.replace("'assistant'",
                                                                 "'assistant', 'developer'")
        got = prompt_ids(http, messages, add_generation_prompt=False)
        assert got == encode(hf_tokenizer, "<system>Be brief.<user>Hi<developer>Say BANANA.")


def test_the_content_format_flag_is_checked() -> None:
    import argparse

    from cadence.server.cli import add_serve_args, settings_from

    parser = add_serve_args(argparse.ArgumentParser())
    for fmt in ("auto", "string", "openai"):
        ns = parser.parse_args(["--chat-template-content-format", fmt])
        assert settings_from(ns).chat_template_content_format == fmt
    with pytest.raises(ValueError, match="chat-template-content-format"):
        settings_from(parser.parse_args(["--chat-template-content-format", "xml"]))


def test_default_chat_template_kwargs_sit_under_the_requests(server_factory) -> None:
    """--default-chat-template-kwargs (vLLM's): every chat request's template sees them, the
    request's own chat_template_kwargs win key by key; /tokenize and /v1/responses alike."""
    template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                "[{{ flavour }}|{{ size | default('none') }}]")
    srv = server_factory(app_kwargs={
        "chat_template": template,
        "default_chat_template_kwargs": {"flavour": "mint", "size": "big"}})
    tok = srv.engine.tokenizer

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        def shown(**extra: object) -> str:
            body = {"messages": [{"role": "user", "content": "hi"}], **extra}
            r = http.post("/tokenize", json=body)
            assert r.status_code == 200, r.text
            return tok.decode(r.json()["tokens"])

        assert shown() == "hi[mint|big]"
        assert shown(chat_template_kwargs={"flavour": "lime"}) == "hi[lime|big]"
        chat = http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "chat_template_kwargs": {"size": "small"}})
        assert chat.json()["usage"]["prompt_tokens"] == count("hi[mint|small]")
        answer = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 1})
        assert answer.json()["usage"]["input_tokens"] == count("hi[mint|big]")


def test_default_chat_template_kwargs_are_checked_at_start_up() -> None:
    from cadence.server.settings import ServerSettings

    with pytest.raises(ValueError, match="--default-chat-template-kwargs must be a JSON object"):
        ServerSettings(default_chat_template_kwargs=["x"])
    with pytest.raises(ValueError, match="--default-chat-template-kwargs: .*tools"):
        ServerSettings(default_chat_template_kwargs={"tools": 5})
    with pytest.raises(ValueError, match="cannot set chat_template: give the server's"):
        ServerSettings(default_chat_template_kwargs={"chat_template": "{{ x }}"})
