"""POST /v1/responses through the official openai client: the answer is the chat endpoint's
answer to the same conversation (same tokens), whole or as typed events in order; reasoning,
tool calls and earlier calls in the input map to the Responses API's items; what this server
does not do is a 400 naming the field."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server.test_reasoning import THINKING_TEMPLATE
from tests.server.test_tool_calls import CALL
from tests.server.tool_call_helpers import scripted_server
from tests.server.waiting import wait_released

GREEDY = dict(model="tiny", temperature=0.0)


def _deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def chat_answer(client: openai.OpenAI, messages: list[dict], max_tokens: int):
    return client.chat.completions.create(messages=messages, max_tokens=max_tokens,
                                          **GREEDY).choices[0]


def test_text_is_the_chat_answer_to_the_same_conversation(client, server) -> None:
    want = chat_answer(client, [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hello"}], 8)
    out = client.responses.create(input="Hello", instructions="Be brief.", max_output_tokens=8,
                                  **GREEDY)
    assert out.output_text == want.message.content
    assert out.object == "response" and out.id.startswith("resp_")
    (item,) = out.output
    assert item.type == "message" and item.role == "assistant"
    assert item.content[0].type == "output_text"
    # Eight tokens cut the answer: incomplete, as OpenAI reports a max_output_tokens cut.
    assert want.finish_reason == "length"
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.output_tokens == 8
    assert out.usage.total_tokens == out.usage.input_tokens + 8
    assert out.store is False and out.instructions == "Be brief."
    unset = client.responses.create(input="Hello", max_output_tokens=2, model="tiny")
    assert unset.temperature == 1.0 and unset.top_p == 1.0  # as applied, not null
    wait_released(server.engine)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_usage_counts_the_prompt_tokens_the_cache_served(client, server, stream: bool) -> None:
    """vLLM's Responses usage always carries cached_tokens (no --enable-prompt-tokens-details
    needed, unlike chat's): 0 the first time, the cached whole blocks of the same input after
    (every block of the prompt but the one its last token is in; 16-token blocks)."""
    text = f"{stream} " + "the garden was green and quiet " * 12

    def usage():
        if not stream:
            return client.responses.create(input=text, max_output_tokens=2, **GREEDY).usage
        events = client.responses.create(input=text, max_output_tokens=2, stream=True,
                                         **GREEDY)
        return [e for e in events if e.type == "response.completed"][0].response.usage

    first, second = usage(), usage()
    assert first.input_tokens == second.input_tokens > 64
    assert first.input_tokens_details.cached_tokens == 0
    assert second.input_tokens_details.cached_tokens == (second.input_tokens - 1) // 16 * 16
    wait_released(server.engine)


def test_streamed_events_add_up_to_the_whole_answer(client, server) -> None:
    kw = dict(input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
              max_output_tokens=6, **GREEDY)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-4].text
    final = events[-1].response
    assert final.output_text == whole.output_text and final.status == whole.status
    assert final.usage.output_tokens == whole.usage.output_tokens
    # Both validate against the openai client's own Response schema, strictly.
    from openai.types.responses import Response

    for body in (whole.model_dump(mode="json"), final.model_dump(mode="json")):
        Response.model_validate(body, strict=False)
    raw = httpx.post(str(client.base_url) + "responses", json={**kw, "model": "tiny"},
                     timeout=60).json()
    Response.model_validate(raw)
    with client.responses.stream(**kw) as stream:  # the client's helper accumulates them
        for _ in stream:
            pass
        assert stream.get_final_response().output_text == whole.output_text
    wait_released(server.engine)


def test_earlier_calls_and_their_outputs_reach_the_template(client) -> None:
    """A function_call item and its output are an assistant message with tool_calls and a
    tool message, as the chat endpoint takes them: the same prompt, the same answer."""
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    want = client.chat.completions.create(messages=messages, max_tokens=5, **GREEDY)
    out = client.responses.create(input=[
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ], max_output_tokens=5, **GREEDY)
    assert out.output_text == want.choices[0].message.content
    assert out.usage.input_tokens == want.usage.prompt_tokens


# Shows an assistant turn's reasoning and calls (as Qwen3's template does for the turn in
# progress), so that what reaches the template can be counted.
REASONING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.content or '' }}{% for c in m.tool_calls or [] %}<call>{{ c.function.name }}</call>"
    "{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_reasoning_item_is_the_reasoning_of_the_assistant_turn_it_opens(
        server_factory) -> None:
    """vLLM's merge: a reasoning item, the calls and the text after it are one assistant
    message whose reasoning the template sees (an agent's tool loop keeps its thinking)."""
    srv = server_factory(app_kwargs={"chat_template": REASONING_TEMPLATE})
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    chat = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "reasoning": "I should call the tool.",
             "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny.", "reasoning": "Done."}]
    tokens = httpx.post(srv.base_url + "/tokenize", json={
        "messages": chat, "add_generation_prompt": True}).json()["count"]
    without = httpx.post(srv.base_url + "/tokenize", json={
        "messages": [{k: v for k, v in m.items() if k != "reasoning"} for m in chat],
        "add_generation_prompt": True}).json()["count"]
    assert tokens > without  # the template shows the reasoning
    out = client.responses.create(input=[
        {"role": "user", "content": "weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "I should call the tool."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text",
                                                         "text": "Done."}]},
        {"role": "assistant", "content": "It is sunny."},
    ], max_output_tokens=2, **GREEDY)
    assert out.usage.input_tokens == tokens
    with pytest.raises(openai.BadRequestError, match="reasoning items alone"):
        client.responses.create(input=[{"type": "reasoning", "id": "rs", "summary": []}],
                                max_output_tokens=2)


def test_logprobs_when_included(client) -> None:
    out = client.responses.create(input="Hi", max_output_tokens=4, top_logprobs=2,
                                  include=["message.output_text.logprobs"], **GREEDY)
    lps = out.output[0].content[0].logprobs
    assert len(lps) == 4 and all(len(t.top_logprobs) == 2 for t in lps)
    assert "".join(t.token for t in lps) == out.output_text


def test_tool_calls_are_function_call_items(server_factory) -> None:
    srv, n = scripted_server(server_factory, "Sure." + CALL, enable_auto_tool_choice=True,
                             tool_call_parser="hermes")
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", input="weather?", max_output_tokens=n,
              tools=[{"type": "function", "name": "get_weather", "parameters": {
                  "type": "object", "properties": {"city": {"type": "string"}}}}],
              extra_body={"ignore_eos": True})
    out = client.responses.create(**kw)
    message, call = out.output
    assert message.type == "message" and out.output_text == "Sure."
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris", "days": 2}
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    events = list(client.responses.create(**kw, stream=True))
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["message", "function_call"]
    (args,) = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(args) == {"city": "Paris", "days": 2}
    final = events[-1].response
    assert [i.type for i in final.output] == ["message", "function_call"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_whole_call_before_a_cut_block_stays_completed(server_factory, stream: bool) -> None:
    """max_output_tokens cuts a second <tool_call> block: the answer is incomplete, and the
    first call, whole, is completed."""
    srv, n = scripted_server(server_factory, CALL + '<tool_call>\n{"na',
                             enable_auto_tool_choice=True, tool_call_parser="hermes")
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", input="weather?", max_output_tokens=n,
              tools=[{"type": "function", "name": "get_weather", "parameters": {
                  "type": "object", "properties": {"city": {"type": "string"}}}}],
              extra_body={"ignore_eos": True})
    out = (list(client.responses.create(**kw, stream=True))[-1].response if stream
           else client.responses.create(**kw))
    call = out.output[0]  # the cut block's text may follow it, as the chat answer shows it
    assert call.type == "function_call" and call.status == "completed"
    assert json.loads(call.arguments) == {"city": "Paris", "days": 2}
    assert out.status == "incomplete"


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_choice_is_one_valid_call(client, stream: bool) -> None:
    """tool_choice naming a function: structured outputs hold even the random tiny model to
    that function's arguments; the answer is one function_call item."""
    params = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["CET", "UTC"]}},
              "required": ["zone"], "additionalProperties": False}
    kw = dict(model="tiny", input="time?", max_output_tokens=60, temperature=1.0,
              tools=[{"type": "function", "name": "get_time", "parameters": params}],
              tool_choice={"type": "function", "name": "get_time"})
    for seed in range(3):
        out = (list(client.responses.create(**kw, stream=True, extra_body={"seed": seed}))[-1]
               .response if stream else client.responses.create(**kw, extra_body={"seed": seed}))
        (call,) = out.output
        assert call.type == "function_call" and call.name == "get_time"
        assert json.loads(call.arguments)["zone"] in ("CET", "UTC")
        assert call.status == "completed" and out.status == "completed"


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_output_tokens_is_incomplete(client, stream: bool) -> None:
    """Three tokens cannot hold the forced call's arguments: the call item, like the
    answer, is incomplete, in the stream's item event and in the whole response."""
    kw = dict(model="tiny", input="time?", max_output_tokens=3, temperature=0.0,
              tools=[{"type": "function", "name": "get_time", "parameters": {
                  "type": "object", "properties": {"zone": {"type": "string"}},
                  "required": ["zone"]}}],
              tool_choice={"type": "function", "name": "get_time"})
    if stream:
        events = list(client.responses.create(**kw, stream=True))
        (done,) = [e.item for e in events if e.type == "response.output_item.done"]
        assert done.type == "function_call" and done.status == "incomplete"
        out = events[-1].response
    else:
        out = client.responses.create(**kw)
    (call,) = out.output
    assert call.type == "function_call" and call.status == "incomplete"
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.output_tokens == 3


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_a_reasoning_item(server_factory, stream: bool) -> None:
    srv, n = scripted_server(server_factory, "plan it</think>the answer",
                             reasoning_parser="deepseek_r1", chat_template=THINKING_TEMPLATE)
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", input="why?", max_output_tokens=n,
              extra_body={"ignore_eos": True})
    if stream:
        events = list(client.responses.create(**kw, stream=True))
        reasoning = "".join(e.delta for e in events
                            if e.type == "response.reasoning_text.delta")
        assert reasoning == "plan it"
        out = events[-1].response
    else:
        out = client.responses.create(**kw)
    thought, answer = out.output
    assert thought.type == "reasoning" and thought.content[0].text == "plan it"
    assert answer.type == "message" and out.output_text == "the answer"
    # The reasoning's own tokens, of the generated ones (a re-encoding of its text once
    # counted more reasoning tokens than output tokens).
    assert out.usage.output_tokens_details.reasoning_tokens == _tokens("plan it")
    # The answer's logprobs are its own tokens' (the reasoning's left out), streamed or not.
    kw["include"] = ["message.output_text.logprobs"]
    got = (list(client.responses.create(**kw, stream=True))[-1].response if stream
           else client.responses.create(**kw))
    lps = got.output[1].content[0].logprobs
    assert "".join(t.token for t in lps) == "the answer"
    # Cut inside the reasoning: the usage still counts its tokens, streamed or not.
    kw["max_output_tokens"] = 3
    cut = (list(client.responses.create(**kw, stream=True))[-1].response if stream
           else client.responses.create(**kw))
    assert cut.status == "incomplete" and [i.type for i in cut.output] == ["reasoning"]
    assert cut.usage.output_tokens_details.reasoning_tokens == 3 == cut.usage.output_tokens


def _tokens(text: str) -> int:
    """``text``'s tokens under the tiny tokenizer (the scripted answer starts with them)."""
    from transformers import AutoTokenizer

    from cadence.model.tiny import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.encode("plan it</think>the answer", add_special_tokens=False)[:len(ids)] == ids
    return len(ids)


@pytest.mark.parametrize(("body", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"input": []}, "input"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input.0"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input.0.content.0"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input.0.content.0.text"),
    ({"input": [{"role": "assistant", "content": [{"type": "refusal", "refusal": 1}]}]},
     "input.0.content.0.refusal"),
    ({"tools": [{"type": "web_search"}]}, "tools.0"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"text": {"format": {"type": "xml"}}}, "text"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": 100000}, "max_output_tokens"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning"),
    ({"temperature": -1}, "temperature"),
    ({"reasoning": {"a": _deep(300)}}, "reasoning"),  # echoed back: bounded first
    ({"tools": [{"type": "function", "name": "f", "z": _deep(300)}]}, "tools"),
    ({"metadata": {"k" * 65: "v"}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata"),
    ({"service_tier": "bogus"}, "service_tier"),
    ({"include": ["bogus"]}, "include.0"),
    # A chat-side check (the template's tool-call arguments) names the input item's field.
    ({"input": [{"role": "user", "content": "q"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "not json"},
                {"type": "function_call_output", "call_id": "c1", "output": "x"}]},
     "input.1.arguments"),
    ({"instructions": "x", "input": [
        {"role": "user", "content": "q"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{bad"}]},
     "input.2.arguments"),
    # The chat message's path, as the input item the client sent (instructions come first).
    ({"instructions": "x", "input": [
        {"role": "user", "content": "q"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": None, "name": "g", "arguments": "{}"}]},
     "input.2.call_id"),
    ({"input": [{"role": 5, "content": "q"}]}, "input.0.role"),
    ({"input": [{"type": "reasoning"}]}, "input"),  # nothing to answer
    # vLLM's request_id as the chat and completions routes bound it.
    ({"request_id": ""}, "request_id"),
    ({"request_id": "x" * 257}, "request_id"),
    # OpenAI's required fields of input items.
    ({"input": [{"role": "user"}]}, "input.0.content"),
    ({"input": [{"role": "user", "content": None}]}, "input.0.content"),
    ({"input": [{"type": "function_call_output", "call_id": "c1", "output": None}]},
     "input.0.output"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c1"}]}, "input.0.output"),
    ({"input": [{"role": "user", "content": "q"},
                {"type": "function_call", "call_id": "c1", "arguments": "{}"}]}, "input.1.name"),
    ({"input": [{"role": "user", "content": "q"},
                {"type": "function_call", "call_id": "c1", "name": "f"}]}, "input.1.arguments"),
    # OpenAI's input message roles (vLLM's): no tool or other role.
    ({"input": [{"role": "tool", "content": "q"}]}, "input.0.role"),
    ({"input": [{"role": "user", "content": "q"}, {"role": "bogus", "content": "q"}]},
     "input.1.role"),
    # NaN and Infinity are Python's, not JSON.
    ({"input": [{"role": "user", "content": "q"},
                {"type": "function_call", "call_id": "c1", "name": "f",
                 "arguments": '{"a": Infinity}'},
                {"type": "function_call_output", "call_id": "c1", "output": "x"}]},
     "input.1.arguments"),
])
def test_what_is_not_done_is_a_400_naming_it(http: httpx.Client, body: dict, param: str) -> None:
    r = http.post("/v1/responses", json={"input": "hi", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(("body", "said", "chat_name"), [
    ({"reasoning": {"effort": "ultra"}}, "reasoning.effort", "reasoning_effort"),
    ({"tools": [{"type": "function", "parameters": {}}]}, "tools.0.name", "function"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format json_schema needs "
     "schema", "json_schema.schema"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name",
     "json_schema"),
    # A schema the grammar compiler refuses (found after the request's own checks).
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "zz"}}}},
     "text.format", "response_format"),
    ({"input": [{"type": "reasoning"}]}, "input: ", "messages"),
    # A value the client sent, quoted in the message, is kept as sent.
    ({"tools": [{"type": "function", "name": "f"}],
      "tool_choice": {"type": "function", "name": "response_format"}}, "'response_format'",
     "text.format"),
])
def test_errors_name_fields_as_this_request_does(http: httpx.Client, body: dict, said: str,
                                                 chat_name: str) -> None:
    r = http.post("/v1/responses", json={"input": "hi", **body})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert said in message and chat_name not in message, message


def test_a_json_schema_format_gives_json(client) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    for seed in range(3):
        out = client.responses.create(
            model="tiny", input="answer in JSON", max_output_tokens=60, temperature=1.0,
            text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
            extra_body={"seed": seed})
        assert out.status == "completed"
        assert isinstance(json.loads(out.output_text)["ok"], bool)


def test_no_response_is_kept(http: httpx.Client) -> None:
    """GET, DELETE and POST .../cancel (vLLM's routes) of a response: none is kept, a 404."""
    for r in (http.get("/v1/responses/resp_123"), http.delete("/v1/responses/resp_123"),
              http.post("/v1/responses/resp_123/cancel")):
        assert r.status_code == 404 and r.json()["error"]["param"] == "response_id"


def test_null_stream_and_empty_instructions_are_their_defaults(client, http) -> None:
    """OpenAI's schema (and vLLM) let stream be null: no stream. An empty instructions adds
    no system turn (vLLM's): the same prompt as none."""
    r = http.post("/v1/responses", json={"model": "tiny", "input": "Hi", "max_output_tokens": 2,
                                          "stream": None})
    assert r.status_code == 200 and r.json()["object"] == "response"
    bare = client.responses.create(input="Hi", max_output_tokens=2, **GREEDY)
    empty = client.responses.create(input="Hi", instructions="", max_output_tokens=2, **GREEDY)
    assert empty.usage.input_tokens == bare.usage.input_tokens


def test_a_bad_part_of_a_call_output_is_named_where_it_is(http: httpx.Client) -> None:
    r = http.post("/v1/responses", json={"model": "tiny", "input": [
        {"role": "user", "content": "w?"},
        {"type": "function_call", "call_id": "c", "name": "w", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c",
         "output": [{"type": "input_text", "text": "ok"}, {"type": "input_image"}]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input.2.output.1"


def test_a_call_item_without_arguments_is_taken(http: httpx.Client) -> None:
    # vLLM's: arguments "" are an empty object (agent loops replay argument-less calls so).
    r = http.post("/v1/responses", json={"model": "tiny", "max_output_tokens": 2, "input": [
        {"role": "user", "content": "w?"},
        {"type": "function_call", "call_id": "c", "name": "w", "arguments": ""},
        {"type": "function_call_output", "call_id": "c", "output": "ok"}]})
    assert r.status_code == 200, r.text


def test_a_turns_text_and_its_calls_are_one_assistant_message(client) -> None:
    """A response's own output comes back as [message, function_call]: one assistant turn
    with content and tool_calls, as the chat endpoint takes it (vLLM's)."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    want = client.chat.completions.create(messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], max_tokens=3, **GREEDY)
    out = client.responses.create(input=[
        {"role": "user", "content": "weather?"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Let me check."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ], max_output_tokens=3, **GREEDY)
    assert out.usage.input_tokens == want.usage.prompt_tokens
    assert out.output_text == want.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True])
def test_max_output_tokens_after_a_call_is_incomplete(server_factory, stream: bool) -> None:
    """The status follows the engine's finish: a max_output_tokens cut after a whole call
    (chat would say "tool_calls") is incomplete (vLLM's)."""
    srv, n = scripted_server(server_factory, "Sure." + CALL + " and then some more words",
                             enable_auto_tool_choice=True, tool_call_parser="hermes")
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", input="weather?", max_output_tokens=n - 3,
              tools=[{"type": "function", "name": "get_weather", "parameters": {
                  "type": "object", "properties": {"city": {"type": "string"}}}}],
              extra_body={"ignore_eos": True})
    out = (list(client.responses.create(**kw, stream=True))[-1].response if stream
           else client.responses.create(**kw))
    assert out.usage.output_tokens == n - 3
    assert [i.type for i in out.output] == ["message", "function_call"]
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    wait_released(srv.engine)


@pytest.mark.parametrize("stream", [False, True])
def test_an_answers_first_bytes_after_reasoning_keep_their_logprobs(server_factory,
                                                                   stream: bool) -> None:
    """Tokens that show no text yet (pieces of a character) right after the reasoning's end
    tag are the answer's: one logprob a token of the answer; the tag's own are left out."""
    from transformers import AutoTokenizer

    from cadence.model.tiny import ensure_tiny_model

    head, answer = "plan it</think>", "東京a"
    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    ids = tok.encode(head + answer, add_special_tokens=False)
    head_ids = tok.encode(head, add_special_tokens=False)
    assert ids[:len(head_ids)] == head_ids  # the answer's tokens are the rest
    srv, n = scripted_server(server_factory, head + answer, reasoning_parser="deepseek_r1",
                             chat_template=THINKING_TEMPLATE)
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", input="q?", max_output_tokens=n,
              include=["message.output_text.logprobs"], extra_body={"ignore_eos": True})
    out = (list(client.responses.create(**kw, stream=True))[-1].response if stream
           else client.responses.create(**kw))
    assert out.output_text == answer
    lps = out.output[1].content[0].logprobs
    assert len(lps) == len(ids) - len(head_ids) and lps[-1].token == "a"


def test_a_streamed_reasoning_item_has_its_part_and_status(server_factory) -> None:
    """As a message item's: the reasoning_text part added and done around its deltas, the
    item in progress when added and completed when done (vLLM's)."""
    srv, n = scripted_server(server_factory, "plan it</think>the answer",
                             reasoning_parser="deepseek_r1", chat_template=THINKING_TEMPLATE)
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    events = list(client.responses.create(model="tiny", input="why?", max_output_tokens=n,
                                          stream=True, extra_body={"ignore_eos": True}))
    kinds = [e.type for e in events if getattr(e, "output_index", None) == 0]
    assert kinds[:2] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-3:] == ["response.reasoning_text.done", "response.content_part.done",
                          "response.output_item.done"]
    added = next(e for e in events if e.type == "response.output_item.added")
    done = next(e for e in events if e.type == "response.output_item.done")
    part_done = next(e for e in events if e.type == "response.content_part.done")
    assert part_done.part.type == "reasoning_text" and part_done.part.text == "plan it"
    assert added.item.status == "in_progress" and done.item.status == "completed"
    assert events[-1].response.output[0].status == "completed"


def test_an_incomplete_final_answer_is_continued(client) -> None:
    """An input ending in an assistant message marked incomplete (a cut answer sent back) is
    continued as chat's continue_final_message continues it (vLLM's); a completed one is
    answered after."""
    turns = [{"role": "user", "content": "Tell me"},
             {"role": "assistant", "content": "Once upon"}]
    want = client.chat.completions.create(
        messages=turns, max_tokens=4, extra_body={"continue_final_message": True,
                                                  "add_generation_prompt": False}, **GREEDY)
    items = [turns[0], {"type": "message", "role": "assistant", "status": "incomplete",
                        "content": [{"type": "output_text", "text": "Once upon"}]}]
    out = client.responses.create(input=items, max_output_tokens=4, **GREEDY)
    assert out.usage.input_tokens == want.usage.prompt_tokens
    assert out.output_text == want.choices[0].message.content
    answered = client.chat.completions.create(messages=turns, max_tokens=4, **GREEDY)
    items[1]["status"] = "completed"
    out = client.responses.create(input=items, max_output_tokens=4, **GREEDY)
    assert out.usage.input_tokens == answered.usage.prompt_tokens
