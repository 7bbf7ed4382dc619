"""--tool-call-parser mistral: both of Mistral's call forms after [TOOL_CALLS], whole and split
into any stream pieces alike, Mistral's nine-character ids, and end to end through the openai
client (special tokens kept in the parsed requests' text, as vLLM)."""

from __future__ import annotations

import json
import re

import openai
import pytest

from cadence.server.tool_calls import parse_tool_calls, tool_call_stream, tool_calls_finish
from tests.server.test_tool_calls import TOOLS
from tests.server.tool_call_helpers import feed_in_pieces, scripted_server, streamed_calls

V11 = '[TOOL_CALLS]get_weather{"city": "Paris", "days": 2}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}'
OLD = ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
       '{"name": "get_time", "arguments": {"zone": "CET"}}]')
BOTH = [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"zone": "CET"})]

TEXTS = [
    (V11, None, BOTH),
    (OLD, None, BOTH),
    ("Let me check." + V11, "Let me check.", BOTH),
    ('[TOOL_CALLS]{"name": "f", "arguments": {}}', None, [("f", {})]),
    ('[TOOL_CALLS]f{"x": [1, {"y": null}]}', None, [("f", {"x": [1, {"y": None}]})]),
    ("No tools needed.", "No tools needed.", []),
    ("[TOOL_CALL] almost", "[TOOL_CALL] almost", []),
    # After the tag, text that is not calls: the whole answer is content.
    ("Hm.[TOOL_CALLS]not a call", "Hm.[TOOL_CALLS]not a call", []),
    ('[TOOL_CALLS]get_weather{"city": "Par', '[TOOL_CALLS]get_weather{"city": "Par', []),
    ('[TOOL_CALLS]f{"x": 1} trailing', '[TOOL_CALLS]f{"x": 1} trailing', []),
    ('[TOOL_CALLS]f{"x": NaN}', '[TOOL_CALLS]f{"x": NaN}', []),
    ("[TOOL_CALLS]f{" + '"a":' * 0 + "}", None, [("f", {})]),
    ('[TOOL_CALLS][{"name": "f"}, 3]', '[TOOL_CALLS][{"name": "f"}, 3]', []),
    ('[TOOL_CALLS]f{"x": ' + "[" * 300 + "]" * 300 + "}",
     '[TOOL_CALLS]f{"x": ' + "[" * 300 + "]" * 300 + "}", []),
    # A "name" with blanks is prose before some JSON, no call.
    ('[TOOL_CALLS]I will call {"a": 1}', '[TOOL_CALLS]I will call {"a": 1}', []),
    # A call's arguments are an object, never a list.
    ("[TOOL_CALLS]get_weather[ARGS][1, 2]", "[TOOL_CALLS]get_weather[ARGS][1, 2]", []),
    # An empty list names no call: the answer stays what it was.
    ("[TOOL_CALLS][]", "[TOOL_CALLS][]", []),
    # The JSON form comes once: a second tag after it makes the whole answer content.
    ('[TOOL_CALLS][{"name": "f", "arguments": {}}][TOOL_CALLS]g{}',
     '[TOOL_CALLS][{"name": "f", "arguments": {}}][TOOL_CALLS]g{}', []),
]


def _shape(calls) -> list:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize(("text", "content", "calls"), TEXTS)
@pytest.mark.parametrize("seed", range(6))
def test_whole_and_streamed_alike(text, content, calls, seed) -> None:
    got_content, got_calls = parse_tool_calls(text, "mistral")
    assert got_content == content and _shape(got_calls) == calls
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in got_calls)
    shown, got, stream = feed_in_pieces("mistral", text, seed)
    assert (shown or None) == content and _shape(got) == calls
    assert tool_calls_finish("stop", stream) == ("tool_calls" if calls else "stop")


def test_content_streams_until_the_tag() -> None:
    stream = tool_call_stream("mistral")
    assert stream.feed("Sure, [TOOL") == ("Sure, ", [])  # the tag's start is held back
    assert stream.feed("_CALLS]f{") == ("", [])
    content, (call,) = stream.feed('"x": 1}', final=True)
    assert content == "" and call.name == "f"


def test_mistral_tool_calls_through_the_openai_client(server_factory) -> None:
    # <|im_start|> is one of the tiny tokenizer's special tokens: kept in the text here.
    srv, n = scripted_server(server_factory, "Sure.<|im_start|>" + V11,
                             enable_auto_tool_choice=True, tool_call_parser="mistral")
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
              max_tokens=n, extra_body={"ignore_eos": True})
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Sure.<|im_start|>"
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls] == BOTH
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in choice.message.tool_calls)
    content, calls = streamed_calls(client, kw)
    assert content == "Sure.<|im_start|>" and [c.index for c in calls] == [0, 1]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == BOTH
    # Without tools nothing is parsed and special tokens are skipped as usual.
    plain = client.chat.completions.create(**{k: v for k, v in kw.items() if k != "tools"})
    assert plain.choices[0].message.content.startswith("Sure.[TOOL_CALLS]")


def test_forced_calls_get_mistral_ids_under_the_mistral_parser(server_factory) -> None:
    """Mistral's templates refuse a history call whose id is not nine alphanumerics: under
    --tool-call-parser mistral a forced choice's calls (named or "required", whole or streamed)
    get such ids too, as the parser's own calls do (vLLM gives them with a Mistral tokenizer)."""
    from tests.server.test_tool_calls import FORCED_TOOLS

    srv = server_factory(app_kwargs={"enable_auto_tool_choice": True,
                                     "tool_call_parser": "mistral"})
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    for choice in ({"type": "function", "function": {"name": "get_time"}}, "required"):
        kw = dict(model="tiny", messages=[{"role": "user", "content": "weather?"}],
                  tools=FORCED_TOOLS, tool_choice=choice, max_tokens=120, temperature=1.0,
                  seed=0)
        whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
        _, streamed = streamed_calls(client, kw)
        for calls in (whole, streamed):
            assert calls, choice
            assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in calls), calls
