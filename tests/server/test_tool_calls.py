"""Tool calls (--enable-auto-tool-choice --tool-call-parser hermes): the parser on crafted texts,
whole and split into any stream pieces, and end to end through the openai client with an engine
whose answer is scripted to be a tool call."""

from __future__ import annotations

import json
import random

import openai
import pytest

from cadence.engine.core import EngineCore
from cadence.server.tool_calls import (
    ToolCallStream,
    parse_tool_calls,
    tool_call_stream,
    tool_calls_finish,
)
from tests.server.tool_call_helpers import feed_in_pieces, streamed_calls
from tests.server.waiting import wait_released

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
TEXTS = [
    ("no call at all", "no call at all", []),
    ("Let me look." + CALL, "Let me look.", [("get_weather", {"city": "Paris", "days": 2})]),
    (CALL + "\n" + CALL.replace("Paris", "Rome"), None,
     [("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Rome", "days": 2})]),
    ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', None, [("f", {"x": 1})]),
    ('<tool_call>{"name": "f", "parameters": {"y": [1, 2]}}', None, [("f", {"y": [1, 2]})]),
    # A bare string, or the text of JSON that is not an object, is serialized: still JSON.
    ('<tool_call>{"name": "f", "arguments": "notobj"}</tool_call>', None, [("f", "notobj")]),
    ('<tool_call>{"name": "f", "arguments": "[1, 2]"}</tool_call>', None, [("f", "[1, 2]")]),
    ("<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
    ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
]


pytestmark = pytest.mark.cpu_engine  # seeded JSON that must end within max_tokens


def test_the_modules_server_runs_on_the_cpu(server) -> None:
    assert server.engine.config.device == "cpu"  # the cpu_engine mark, on a GPU machine too


def _shape(calls) -> list:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize(("text", "content", "calls"), TEXTS)
def test_whole_texts(text, content, calls) -> None:
    got_content, got_calls = parse_tool_calls(text)
    assert got_content == content and _shape(got_calls) == calls
    assert len({c.id for c in got_calls}) == len(got_calls)


@pytest.mark.parametrize("seed", range(25))
def test_any_split_streams_the_same_calls(seed) -> None:
    rng = random.Random(seed)
    for text, content, calls in TEXTS[:5]:  # valid texts (an invalid one streams as text)
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text), rng.randrange(0, 8))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        stream = ToolCallStream()
        got, shown = [], ""
        for i, piece in enumerate(pieces):
            c, new = stream.feed(piece, final=i == len(pieces) - 1)
            shown += c
            got.extend(new)
            assert "<tool" not in shown  # no half tag is ever shown as content
        assert (shown or None) == content and _shape(got) == calls, pieces


NOT_CALLS = [  # streamed, each is content as it stands: no call, nothing lost or reordered
    "Hi <tool", "Hi <tool_ca", "a <b> <", "<tool_call>{not json}</tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>', "<tool_call>[1, 2]</tool_call> after",
    # An opening tag with nothing after it (the answer ended there): vLLM keeps the text.
    "<tool_call>", "Hi <tool_call>",
    # Model output the JSON parser cannot take or that is not JSON: past the nesting bound (a
    # RecursionError further down), an integer past Python's digit limit, NaN, an overflow
    # to infinity. None is a call; none may fail the request.
    '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 3000 + "]" * 3000 + "}}</tool_call>",
    '<tool_call>{"name": "f", "arguments": {"a": ' + "9" * 5000 + "}}</tool_call>",
    '<tool_call>{"name": "f", "arguments": {"a": NaN}}</tool_call>',
    '<tool_call>{"name": "f", "arguments": {"a": 1e999}}</tool_call>',
    '<tool_call>{"name": "f", "arguments": {"city": "Paris \\ud83d"}}</tool_call>',
    '<tool_call>{"name": "get\\ud800", "arguments": {}}</tool_call>',  # in the name too
]


@pytest.mark.parametrize("text", NOT_CALLS)
@pytest.mark.parametrize("seed", range(8))
def test_text_that_is_not_a_call_streams_as_it_stands(text, seed) -> None:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text), rng.randrange(0, 5))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    stream = ToolCallStream()
    shown, got = "", []
    for i, piece in enumerate(pieces):
        c, new = stream.feed(piece, final=i == len(pieces) - 1)
        shown += c
        got.extend(new)
    assert got == [] and shown == text, pieces
    assert parse_tool_calls(text) == (text, [])


BAD = "<tool_call>{bad}</tool_call>"
MIXED = [  # valid calls and blocks that are not calls: (text, content, calls)
    (CALL + BAD, BAD, [("get_weather", {"city": "Paris", "days": 2})]),
    (BAD + " then " + CALL + " after", BAD + " then ",
     [("get_weather", {"city": "Paris", "days": 2})]),
    ("Hi " + CALL + BAD + CALL.replace("Paris", "Rome"), "Hi " + BAD,
     [("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Rome", "days": 2})]),
]


@pytest.mark.parametrize(("text", "content", "calls"), MIXED)
@pytest.mark.parametrize("seed", range(10))
def test_streamed_and_whole_answers_agree(text, content, calls, seed) -> None:
    # A call that went out in a stream cannot be taken back, so a whole answer keeps its valid
    # calls too; the blocks that are not calls are content in both.
    assert parse_tool_calls(text)[0] == content and _shape(parse_tool_calls(text)[1]) == calls
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text), rng.randrange(0, 9))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    stream, shown, got = ToolCallStream(), "", []
    for i, piece in enumerate(pieces):
        c, new = stream.feed(piece, final=i == len(pieces) - 1)
        shown += c
        got.extend(new)
    assert shown == content and _shape(got) == calls, pieces


def test_forced_calls_of_output_the_parser_cannot_take_are_no_calls() -> None:
    from cadence.server.tool_calls import parse_forced_calls

    for text in ('{"a": ' + "[" * 3000 + "]" * 3000 + "}", '{"a": ' + "9" * 5000 + "}",
                 '{"a": NaN}', '{"a": 1e999}'):
        # A named function's call takes its text as it is (vLLM's; even cut short) ...
        (call,) = parse_forced_calls(text, "f")
        assert (call.name, call.arguments) == ("f", text)
        # ... while "required" needs the list's JSON.
        assert parse_forced_calls(f'[{{"name": "f", "parameters": {text}}}]', None) is None
    assert parse_forced_calls("", "f") is None and parse_forced_calls("", None) is None
    (cut,) = parse_forced_calls('{"city": "Par', "f")  # max_tokens ended it
    assert cut.arguments == '{"city": "Par'
    assert parse_forced_calls('[{"name": "f\\udc00", "parameters": {}}]', None) is None
    (call,) = parse_forced_calls('{"a": 1}', "f")
    assert (call.name, call.arguments) == ("f", '{"a": 1}')


def test_arguments_keep_their_characters() -> None:
    """Arguments are re-serialized with their characters unescaped (vLLM: ensure_ascii=False): a
    client that shows them, or sends them back in the conversation, sees Zürich, not
    Z\\u00fcrich."""
    _, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"city": "Zürich"}}'
                                "</tool_call>")
    assert [c.arguments for c in calls] == ['{"city": "Zürich"}']


def test_the_last_piece_lets_a_held_tag_start_out() -> None:
    s = ToolCallStream()
    assert s.feed("Hi <tool") == ("Hi ", [])  # may be a tag: held back
    assert s.feed("", final=True) == ("<tool", [])
    assert ToolCallStream().feed("Hi <tool", final=True) == ("Hi <tool", [])


class ScriptedCore(EngineCore):
    """The real engine, except that every request's sampled tokens are ``SCRIPT`` in order."""

    SCRIPT: list[int] = []

    def __init__(self, args) -> None:
        super().__init__(args)
        execute, counts = self.runner.execute_model, {}

        def scripted(so):
            pending = execute(so)

            class Scripted:
                def get_output(self):
                    out = pending.get_output()
                    for row, req_id in enumerate(out.req_ids):
                        if out.sampled_token_ids[row]:
                            k = counts[req_id] = counts.get(req_id, -1) + 1
                            out.sampled_token_ids[row] = [ScriptedCore.SCRIPT[k]]
                            if out.logprobs is not None:  # the row's chosen token too
                                out.logprobs.logprob_token_ids[row][0] = ScriptedCore.SCRIPT[k]
                    return out

            return Scripted()

        self.runner.execute_model = scripted


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather by city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture
def tool_server(server_factory):
    from transformers import AutoTokenizer

    from cadence.model.tiny import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    ScriptedCore.SCRIPT = tok.encode("Sure." + CALL + "\n" + CALL.replace("Paris", "Rome"),
                                     add_special_tokens=False)
    srv = server_factory(core_factory=ScriptedCore, app_kwargs={
        "enable_auto_tool_choice": True, "tool_call_parser": "hermes"})
    return srv, len(ScriptedCore.SCRIPT)


def test_tool_calls_through_the_openai_client(tool_server) -> None:
    srv, n = tool_server
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
              max_tokens=n, temperature=0.0, extra_body={"ignore_eos": True})
    out = client.chat.completions.create(**kw)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Sure."
    first, second = choice.message.tool_calls
    assert first.type == "function" and first.function.name == "get_weather"
    assert json.loads(first.function.arguments) == {"city": "Paris", "days": 2}
    assert json.loads(second.function.arguments) == {"city": "Rome", "days": 2}
    assert first.id != second.id
    content, calls, finishes = "", [], []
    chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        calls.extend(delta.tool_calls or [])
        finishes.append(chunk.choices[0].finish_reason)
    assert content == "Sure."
    # The finish reason comes once, on the last chunk; each call is a later chunk's delta.
    assert finishes == [None] * (len(chunks) - 1) + ["tool_calls"]
    assert [c.index for c in calls] == [0, 1]
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    assert all(c.function.name == "get_weather" and c.type == "function" for c in calls)
    # parallel_tool_calls false (vLLM): the first call only, whole or streamed.
    one = client.chat.completions.create(**kw, parallel_tool_calls=False).choices[0]
    assert one.finish_reason == "tool_calls" and len(one.message.tool_calls) == 1
    assert json.loads(one.message.tool_calls[0].function.arguments)["city"] == "Paris"
    streamed_one = [d for c in client.chat.completions.create(**kw, stream=True,
                                                               parallel_tool_calls=False)
                    if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [(d.index, json.loads(d.function.arguments)["city"]) for d in streamed_one] == [
        (0, "Paris")]
    # tool_choice "none": the answer is plain text.
    plain = client.chat.completions.create(**kw, tool_choice="none")
    assert plain.choices[0].message.content.startswith("Sure.<tool_call>")
    assert not plain.choices[0].message.tool_calls


def test_an_answer_cut_inside_a_call_finishes_with_length(tool_server) -> None:
    """max_tokens cuts the second call before its closing tag: the first call goes out, the
    finish reason stays "length", whole and streamed (a call cut short is no call)."""
    srv, n = tool_server
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
              max_tokens=n - 5, temperature=0.0, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "length"
    assert [json.loads(c.function.arguments)["city"] for c in whole.message.tool_calls] == [
        "Paris"]
    finishes, cities = [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            finishes += [choice.finish_reason] if choice.finish_reason else []
            cities += [json.loads(c.function.arguments)["city"]
                       for c in choice.delta.tool_calls or []]
    assert finishes == ["length"] and cities == ["Paris"]


def test_tool_calls_finish() -> None:
    from cadence.server.tool_calls import tool_calls_finish

    for text, finish, want in [
        (CALL, "stop", "tool_calls"),
        (CALL, "length", "tool_calls"),  # cut right after a whole call: the calls stand
        (CALL + CALL[:-3], "length", "length"),  # cut inside the second
        (CALL[:-3], "length", "length"),  # no call made
        ('<tool_call>{"name": "f", "parameters": {}}', "length", "tool_calls"),  # parses
        ("plain", "stop", "stop"),
        (CALL, None, None),
    ]:
        stream = ToolCallStream()
        stream.feed(text, final=True)
        assert tool_calls_finish(finish, stream) == want, text


def test_each_streamed_choice_parses_its_own_tool_calls(tool_server) -> None:
    """n = 2: every choice's text goes through a splitter of its own (a shared one would take
    the second choice's text for the inside of the first's calls)."""
    srv, n = tool_server
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    chunks = [c for c in client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
        max_tokens=n, temperature=1.0, n=2, stream=True, extra_body={"ignore_eos": True})
        if c.choices]
    content: dict[int, str] = {0: "", 1: ""}
    calls: dict[int, list] = {0: [], 1: []}
    finish: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            content[choice.index] += choice.delta.content or ""
            calls[choice.index] += choice.delta.tool_calls or []
            if choice.finish_reason is not None:
                finish[choice.index] = choice.finish_reason
    for i in (0, 1):  # every request's answer is the same script
        assert content[i] == "Sure.", i
        assert [(c.index, json.loads(c.function.arguments)["city"]) for c in calls[i]] == [
            (0, "Paris"), (1, "Rome")], i
    assert finish == {0: "tool_calls", 1: "tool_calls"}


@pytest.mark.parametrize(("body", "fragment"), [
    ({"tools": TOOLS}, "--enable-auto-tool-choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
      "structured_outputs": {"regex": "a+"}}, "cannot be combined"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "has not been passed"),
    ({"tool_choice": "auto"}, "`tools` must be set"),
])
def test_tool_choice_errors_name_the_parameter(http, body, fragment) -> None:
    resp = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "tool_choice" and fragment in error["message"]


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "bad"}}])
def test_a_forced_tools_bad_schema_names_that_tool(http, choice) -> None:
    """The grammar of a forced choice is built from the tools' schemas: one that cannot be
    followed is the error of that tool's parameters, not of a field the client never sent."""
    tools = [TOOLS[0], {"type": "function", "function": {
        "name": "bad", "parameters": {"type": "zz"}}}]
    resp = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": tools,
        "tool_choice": choice})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "tools.1.function.parameters"
    assert error["message"].startswith("tools.1.function.parameters: ")
    assert "structured_outputs" not in error["message"]


WEATHER = {"type": "object", "properties": {
    "city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
FORCED_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}}},
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_named_and_required_tool_choice_give_valid_calls(server, stream) -> None:
    """Structured outputs make even the random tiny model call the tools with valid
    arguments; no server flag is needed (nothing is parsed out of free text)."""
    import jsonschema

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in FORCED_TOOLS}
    for choice in ({"type": "function", "function": {"name": "get_time"}}, "required"):
        for seed in range(3):
            kw = dict(model="tiny", messages=[{"role": "user", "content": "weather?"}],
                      tools=FORCED_TOOLS, tool_choice=choice, max_tokens=120, temperature=1.0,
                      seed=seed)
            if stream:
                calls, finish = [], None
                for chunk in client.chat.completions.create(**kw, stream=True):
                    if chunk.choices:
                        calls.extend(chunk.choices[0].delta.tool_calls or [])
                        finish = chunk.choices[0].finish_reason or finish
            else:
                out = client.chat.completions.create(**kw)
                calls, finish = out.choices[0].message.tool_calls, out.choices[0].finish_reason
            assert calls, (choice, seed)
            for call in calls:
                jsonschema.validate(json.loads(call.function.arguments),
                                    schemas[call.function.name])
            if choice == "required":
                assert finish == "tool_calls"
            else:
                assert [c.function.name for c in calls] == ["get_time"] and finish == "stop"


def test_required_takes_tools_whose_schemas_reference_their_definitions(server) -> None:
    """openai.pydantic_function_tool's schemas keep nested models under $defs, referenced from
    the root (#/$defs/...); under "required" each tool's schema is nested in one list schema,
    so the definitions are lifted to its root (vLLM's), the request's own schemas untouched.
    Draft 7's "definitions" likewise; one name with two schemas is a 400 naming tools."""
    import jsonschema

    loc = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
           "required": ["city"], "additionalProperties": False}
    weather = {"type": "object", "properties": {"loc": {"$ref": "#/$defs/Loc"}},
               "required": ["loc"], "additionalProperties": False, "$defs": {"Loc": loc}}
    when = {"type": "object", "properties": {"loc": {"$ref": "#/$defs/Loc"},
                                             "at": {"$ref": "#/definitions/Hour"}},
            "required": ["loc", "at"], "additionalProperties": False, "$defs": {"Loc": loc},
            "definitions": {"Hour": {"type": "integer", "minimum": 0, "maximum": 23}}}
    tools = [{"type": "function", "function": {"name": "weather", "parameters": weather}},
             {"type": "function", "function": {"name": "when", "parameters": when}}]
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    for seed in range(3):
        out = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=tools,
            tool_choice="required", max_tokens=150, temperature=1.0, seed=seed)
        calls = out.choices[0].message.tool_calls
        assert calls and out.choices[0].finish_reason == "tool_calls"
        for call in calls:
            schema = weather if call.function.name == "weather" else when
            jsonschema.validate(json.loads(call.function.arguments), schema)
    assert "$defs" in weather and "definitions" in when  # the request's schemas as they were
    clash = [tools[0], {"type": "function", "function": {"name": "other", "parameters": {
        "type": "object", "properties": {"loc": {"$ref": "#/$defs/Loc"}},
        "$defs": {"Loc": {"type": "string"}}}}}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=clash,
            tool_choice="required", max_tokens=5)
    error = info.value.body
    assert error["param"] == "tools" and "'Loc'" in error["message"], error


def test_a_forced_tool_choice_overrules_a_response_format(server) -> None:
    """vLLM: beside a forced tool choice, a response_format (or, for "required",
    structured_outputs) gives way to the tools' grammar; only a named function with
    structured_outputs is an error."""
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    for choice, extra in (("required", {"response_format": {"type": "json_object"}}),
                          ("required", {"extra_body": {"structured_outputs": {"regex": "a+"}}}),
                          ({"type": "function", "function": {"name": "get_time"}},
                           {"response_format": {"type": "json_object"}})):
        out = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "weather?"}],
            tools=FORCED_TOOLS, tool_choice=choice, max_tokens=120, temperature=1.0, seed=0,
            **extra)
        calls = out.choices[0].message.tool_calls
        assert calls and all(c.function.name in ("get_weather", "get_time") for c in calls)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_forced_answer_cut_short_is_no_text(server, stream) -> None:
    """vLLM: max_tokens cutting a forced tool choice's JSON leaves a named function's call with
    the arguments so far, and a "required" list no call; the content is "" either way."""
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    for choice in ({"type": "function", "function": {"name": "get_time"}}, "required"):
        kw = dict(model="tiny", messages=[{"role": "user", "content": "weather?"}],
                  tools=FORCED_TOOLS, tool_choice=choice, max_tokens=3, temperature=1.0, seed=1,
                  extra_body={"return_token_ids": True})
        if stream:
            calls, content, finish, ids = [], "", None, []
            for chunk in client.chat.completions.create(**kw, stream=True):
                if chunk.choices:
                    delta = chunk.choices[0].delta
                    calls.extend(delta.tool_calls or [])
                    content += delta.content or ""
                    finish = chunk.choices[0].finish_reason or finish
                    ids += getattr(chunk.choices[0], "token_ids", None) or []
        else:
            out = client.chat.completions.create(**kw)
            msg, finish = out.choices[0].message, out.choices[0].finish_reason
            calls, content, ids = msg.tool_calls or [], msg.content, out.choices[0].token_ids
        assert finish == "length" and content == "", (choice, content)
        if choice == "required":
            assert calls == []
        else:
            text = server.engine.tokenizer.decode(ids)
            assert [(c.function.name, c.function.arguments) for c in calls] == [
                ("get_time", text)]


def test_a_lone_surrogate_in_tool_arguments_is_a_400(server_factory) -> None:
    """JSON's "\\ud800" escape in an assistant's tool-call arguments decodes to a lone surrogate;
    a template that renders the arguments makes text no tokenizer takes: a 400 naming messages
    on both routes that render conversations, and the server serves on."""
    import httpx

    template = ("{% for m in messages %}{{ m.content or '' }}{% for c in m.tool_calls or [] %}"
                "{{ c.function.arguments.a }}{% endfor %}{% endfor %}")
    srv = server_factory(app_kwargs={"chat_template": template})
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {
                    "name": "f", "arguments": '{"a": "\\ud800"}'}}]},
                {"role": "tool", "tool_call_id": "1", "content": "ok"}]
    with httpx.Client(base_url=srv.base_url, timeout=60) as http:
        for path in ("/v1/chat/completions", "/tokenize"):
            r = http.post(path, json={"messages": messages, "max_tokens": 2})
            assert r.status_code == 400, (path, r.text)
            assert r.json()["error"]["param"] == "messages"
        fine = [m if m["role"] != "assistant" else {**m, "tool_calls": [{**m["tool_calls"][0],
                "function": {"name": "f", "arguments": '{"a": "x"}'}}]} for m in messages]
        assert http.post("/v1/chat/completions",
                         json={"messages": fine, "max_tokens": 2}).status_code == 200


# --- llama3_json (vLLM's parser for Llama 3.x) ----------------------------------------------------

L3 = '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}'
L3_TEXTS = [
    (L3, None, [("get_weather", {"city": "Paris", "days": 2})]),
    ("<|python_tag|>" + L3 + "; " + L3.replace("Paris", "Rome"), None,
     [("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Rome", "days": 2})]),
    ('  \n{"name": "f", "arguments": {"x": [1, {"y": null}]}}', None, [("f", {"x": [1, {"y": None}]})]),
    # Blanks before the tag are no content either: the call after it is read.
    ("\n <|python_tag|>" + L3, None, [("get_weather", {"city": "Paris", "days": 2})]),
    ('{"name": "f", "parameters": "text"}', None, [("f", "text")]),
    # Text first, or JSON that is not a call (no name, no parameters, not JSON, cut off): content.
    ("It is sunny. " + L3, "It is sunny. " + L3, []),
    ('{"name": "f"}', '{"name": "f"}', []),
    ('{"parameters": {}}', '{"parameters": {}}', []),
    ("{not json}", "{not json}", []),
    ('{"name": "f", "parameters": {"a": ', '{"name": "f", "parameters": {"a": ', []),
    ("<|python_ta", "<|python_ta", []),
    # What JSON does not allow, or nests past the bound, is no call either: content.
    ('{"name": "f", "parameters": NaN}', '{"name": "f", "parameters": NaN}', []),
    ('{"name": "f", "parameters": {"x": -Infinity}}', '{"name": "f", "parameters": {"x": -Infinity}}',
     []),
    ('{"name": "f", "parameters": ' + "[" * 300 + "]" * 300 + "}",
     '{"name": "f", "parameters": ' + "[" * 300 + "]" * 300 + "}", []),
    # After a call, the rest is no content (vLLM's answer with calls has none).
    (L3 + " Anything else?", None, [("get_weather", {"city": "Paris", "days": 2})]),
    (L3 + '; {"name": "g", "parame', None, [("get_weather", {"city": "Paris", "days": 2})]),
]


@pytest.mark.parametrize(("text", "content", "calls"), L3_TEXTS)
@pytest.mark.parametrize("seed", range(6))
def test_llama3_json_whole_and_streamed_alike(text, content, calls, seed) -> None:
    got_content, got_calls = parse_tool_calls(text, "llama3_json")
    assert got_content == content and _shape(got_calls) == calls
    shown, got, stream = feed_in_pieces("llama3_json", text, seed)
    assert (shown or None) == content and _shape(got) == calls
    # An answer cut inside an object after a call keeps its "length" finish.
    cut = text.endswith('"parame') and bool(calls)
    assert tool_calls_finish("length", stream) == ("length" if cut or not calls else "tool_calls")


def test_llama3_json_tool_calls_through_the_openai_client(server_factory) -> None:
    from transformers import AutoTokenizer

    from cadence.model.tiny import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    script = L3 + "; " + L3.replace("Paris", "Rome")
    ScriptedCore.SCRIPT = tok.encode(script, add_special_tokens=False)
    srv = server_factory(core_factory=ScriptedCore, app_kwargs={
        "enable_auto_tool_choice": True, "tool_call_parser": "llama3_json"})
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
              max_tokens=len(ScriptedCore.SCRIPT), extra_body={"ignore_eos": True})
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [json.loads(c.function.arguments)["city"] for c in choice.message.tool_calls] == [
        "Paris", "Rome"]
    content, calls = streamed_calls(client, kw)
    assert content == "" and [c.index for c in calls] == [0, 1]
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Rome"]


def test_an_unknown_tool_call_parser_is_a_one_line_error() -> None:
    from cadence.server.settings import ServerSettings

    with pytest.raises(ValueError, match="hermes, llama3_json, mistral, pythonic"):
        ServerSettings(tool_call_parser="granite")
    with pytest.raises(ValueError, match="unknown tool call parser"):
        tool_call_stream("granite")

@pytest.mark.parametrize("stream", [False, True])
def test_a_required_call_cut_at_max_tokens_finishes_by_length(server_factory, stream) -> None:
    """tool_choice "required": "tool_calls" only where the answer stopped by itself (vLLM's
    `finish_reason == "stop"` condition); the same JSON ended by max_tokens on its last token
    still parses into the call but finishes "length"."""
    from transformers import AutoTokenizer

    from cadence.model.tiny import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    answer = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    ScriptedCore.SCRIPT = tok.encode(answer, add_special_tokens=False) + [eos] * 4
    n = len(ScriptedCore.SCRIPT) - 4
    srv = server_factory(core_factory=ScriptedCore)
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
              tool_choice="required")
    for max_tokens, finish in ((n, "length"), (n + 4, "tool_calls")):
        body = {**kw, "max_tokens": max_tokens}
        if stream:
            got, calls = None, []
            for chunk in client.chat.completions.create(**body, stream=True):
                if chunk.choices:
                    calls.extend(chunk.choices[0].delta.tool_calls or [])
                    got = chunk.choices[0].finish_reason or got
        else:
            choice = client.chat.completions.create(**body).choices[0]
            got, calls = choice.finish_reason, choice.message.tool_calls or []
        assert got == finish
        assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}]
    wait_released(srv.engine)


def test_the_sdk_stream_helper_closes_every_call(server) -> None:
    """OpenAI frames a streamed answer's finish reason in an empty chunk after its calls; the
    SDK's stream helper fires a call's "arguments.done" only at a later chunk, so a call sent
    whole in the finishing chunk was never closed. Each call now comes first, the finish
    reason after it (forced choices, one choice and several)."""
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    for choice in ({"type": "function", "function": {"name": "get_time"}}, "required"):
        for n in (1, 3):
            with client.chat.completions.stream(
                    model="tiny", messages=[{"role": "user", "content": "weather?"}],
                    tools=FORCED_TOOLS, tool_choice=choice, max_tokens=480, temperature=1.0,
                    seed=2, n=n) as stream:
                events = list(stream)
                final = stream.get_final_completion()
            done = [(e.index, e.name) for e in events
                    if e.type == "tool_calls.function.arguments.done"]
            calls = [(i, call.function.name) for ch in final.choices
                     for i, call in enumerate(ch.message.tool_calls or [])]
            assert calls and sorted(done) == sorted(calls), (choice, n, done, calls)
            # The finishing chunks carry no delta of their own.
            finishing = [e.chunk.choices[0] for e in events
                         if e.type == "chunk" and e.chunk.choices
                         and e.chunk.choices[0].finish_reason is not None]
            assert len(finishing) == n
            assert all(not c.delta.tool_calls and not c.delta.content for c in finishing)
