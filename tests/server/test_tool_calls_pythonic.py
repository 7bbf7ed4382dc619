"""--tool-call-parser pythonic: Python lists of keyword calls, whole and split into any stream
pieces alike, and end to end through the openai client with a scripted answer."""

from __future__ import annotations

import json

import openai
import pytest

from cadence.server.tool_calls import parse_tool_calls, tool_call_stream, tool_calls_finish
from tests.server.test_tool_calls import TOOLS
from tests.server.tool_call_helpers import feed_in_pieces, scripted_server, streamed_calls

PY = '[get_weather(city="Paris", days=2), get_time(zone=\'CET\', exact=True, at=None)]'
PY_CALLS = [("get_weather", {"city": "Paris", "days": 2}),
            ("get_time", {"zone": "CET", "exact": True, "at": None})]

TEXTS = [
    (PY, None, PY_CALLS),
    ("  " + PY + "\n", None, PY_CALLS),
    ("<|python_start|>" + PY + "<|python_end|>", None, PY_CALLS),
    ('[f(xs=[1, 2.5, "a"], d={"k": [None]}, t=(1, 2))]', None,
     [("f", {"xs": [1, 2.5, "a"], "d": {"k": [None]}, "t": [1, 2]})]),
    ("[f()]", None, [("f", {})]),
    # JSON's names for the constants, and dotted callees, as vLLM's parser reads them.
    ("[get_weather(city=null, x=true, y=false)]", None,
     [("get_weather", {"city": None, "x": True, "y": False})]),
    ('[weather.get(city="x"), a . b.c(d=[true, {"k": null}])]', None,
     [("weather.get", {"city": "x"}), ("a.b.c", {"d": [True, {"k": None}]})]),
    ("[os.system(x='ls')]", None, [("os.system", {"x": "ls"})]),  # a name, never run
    # Not a list of keyword calls, or not Python at all: content, whole.
    ("The weather is fine.", "The weather is fine.", []),
    ("[1] First, the weather.", "[1] First, the weather.", []),
    ('[f("Paris")]', '[f("Paris")]', []),  # positional
    ("[f(x=g())]", "[f(x=g())]", []),  # not a literal
    ("[f(**kw)]", "[f(**kw)]", []),
    ("[f(x=true_value)]", "[f(x=true_value)]", []),  # other names are no literals
    ("[f(x=1).g(y=2)]", "[f(x=1).g(y=2)]", []),  # a call's attribute is no callee
    ("[f(x=1e999)]", "[f(x=1e999)]", []),  # infinity: no JSON
    # Python literals with no JSON form: content, not a failed request.
    ("[f(a={1, 2})]", "[f(a={1, 2})]", []),
    ("[f(a=1j)]", "[f(a=1j)]", []),
    ('[f(a=b"x")]', '[f(a=b"x")]', []),
    ("[f(a=...)]", "[f(a=...)]", []),
    ("[f(a={(1, 2): 3})]", "[f(a={(1, 2): 3})]", []),
    ("[f(a={[1]: 2})]", "[f(a={[1]: 2})]", []),  # an unhashable key: no literal at all
    ('[get_weather(city="Par', '[get_weather(city="Par', []),  # cut by max_tokens
    ("[]", "[]", []),
    ("[f(x=" + "[" * 300 + "]" * 300 + ")]", "[f(x=" + "[" * 300 + "]" * 300 + ")]", []),
    # The list must be the whole answer (vLLM's parser takes the whole output as Python).
    (PY + " Anything else?", PY + " Anything else?", []),
    # A long argument (a file's text, well under the 1 MiB bound on the source) is a call.
    ('[write(text="' + "x" * 2000 + '")]', None, [("write", {"text": "x" * 2000})]),
]


def _shape(calls) -> list:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize(("text", "content", "calls"), TEXTS)
@pytest.mark.parametrize("seed", range(6))
def test_whole_and_streamed_alike(text, content, calls, seed) -> None:
    got_content, got_calls = parse_tool_calls(text, "pythonic")
    assert got_content == content and _shape(got_calls) == calls
    assert len({c.id for c in got_calls}) == len(got_calls)
    shown, got, stream = feed_in_pieces("pythonic", text, seed)
    assert (shown or None) == content and _shape(got) == calls
    assert tool_calls_finish("stop", stream) == ("tool_calls" if calls else "stop")


def test_text_that_cannot_be_calls_streams_at_once() -> None:
    stream = tool_call_stream("pythonic")
    assert stream.feed("The ") == ("The ", [])  # not "[": content from the first piece
    held = tool_call_stream("pythonic")
    assert held.feed("[get_wea") == ("", [])  # may be a call: held to the end
    assert held.feed("ther(city='x')]") == ("", [])
    content, (call,) = held.feed("", final=True)
    assert content == "" and call.name == "get_weather"
    other = tool_call_stream("pythonic")
    assert other.feed("[") == ("", []) and other.feed("1] x") == ("[1] x", [])


def test_pythonic_tool_calls_through_the_openai_client(server_factory) -> None:
    srv, n = scripted_server(server_factory, PY, enable_auto_tool_choice=True,
                             tool_call_parser="pythonic")
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
              max_tokens=n, extra_body={"ignore_eos": True})
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls] == PY_CALLS
    content, calls = streamed_calls(client, kw)
    assert content == "" and [c.index for c in calls] == [0, 1]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == PY_CALLS


def test_a_dot_leader_line_is_no_catastrophic_backtracking() -> None:
    """A streamed answer like a table of contents ("[Introduction . . . . 1]") must be told
    from a call list at once: a pattern whose parts could share the blanks between dots took
    time doubling with each dot, on the event loop. Run apart, the timeout a safety bound
    (the linear pattern takes microseconds, the old one ages for 60 dots)."""
    import subprocess
    import sys

    code = ("from cadence.server.tool_calls_pythonic import PythonicCallStream as S\n"
            "for text in ('[Introduction' + ' .' * 60 + ' 1]', '[a' + ' . ' * 60 + '!'):\n"
            "    s = S()\n"
            "    shown = ''.join(s.feed(c)[0] for c in text) + s.feed('', final=True)[0]\n"
            "    assert shown == text, shown\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
